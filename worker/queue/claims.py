"""Owns claiming due jobs from a lane's queue in one round trip, as arq claims them.

**One-trip polls** (a change over arq, for ``worker/queue/consumer.py``). arq keeps
running jobs in the queue's sorted set and, at every poll, checks each one it reads
with three round trips (WATCH, EXISTS, ZSCORE) before skipping it, then claims a
free one with a fourth; it also reads only ``queue_read_limit`` ids, oldest first.
With 32 sequences running, a poll every 50 ms cost ~100 round trips on the event
loop the engine shares (measured: 31 concurrent requests reached the engine ~1 s
after the first), and with more jobs running across workers than the read limit, a
new job was never seen at all. Here a poll is one script (``_CLAIM``): it reads a
wide window, finds the jobs running anywhere with one MGET of their in-progress keys
per ``CHECK_BATCH`` ids (not a command per id), and claims as many free ones as this
poll may start, each exactly as arq claims it (its in-progress key), so arq runs them
unchanged. A wake-up to start a job thus costs one round trip, not five, and a few
commands inside Redis, not one per job the lane is running.
"""

from __future__ import annotations

import time

from shared import keys
from shared.jobs.arq_seam import QueuePool

# Queue ids read per poll: must exceed the jobs running across all workers of a lane,
# which stay in the queue's sorted set until they finish.
READ_WINDOW = 2048
# In-progress keys checked per MGET: the running jobs a lane holds at the head of its
# queue fit in one or two, and Lua's unpack stays far below its stack limit.
CHECK_BATCH = 256
# Claims up to ARGV[3] due jobs of queue KEYS[1] (oldest first) that no worker runs: arq's
# claim, an in-progress key (prefix ARGV[5]) living ARGV[2] ms. Returns id, score, id, score...
# ARGV[1] is now (ms), ARGV[4] the read window. Running jobs stay in the queue (arq's layout),
# so a SET NX per id read cost one command per running job at every poll (202k of 365k
# commands at 8 workers); one MGET per CHECK_BATCH ids finds the free ones instead, and the
# script stops once it has claimed what the poll has room for. NX stays as a guard: the
# script is atomic, so a key MGET saw missing is still missing.
_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[4])
local wanted = tonumber(ARGV[3]) * 2
local batch = tonumber(ARGV[6]) * 2
local claimed = {}
for first = 1, #due, batch do
    local names = {}
    for i = first, math.min(first + batch - 1, #due), 2 do
        names[#names + 1] = ARGV[5] .. due[i]
    end
    local running = redis.call('MGET', unpack(names))
    for j = 1, #names do
        if not running[j] and redis.call('SET', names[j], '1', 'NX', 'PX', ARGV[2]) then
            local i = first + (j - 1) * 2
            claimed[#claimed + 1] = due[i]
            claimed[#claimed + 1] = due[i + 1]
            if #claimed >= wanted then return claimed end
        end
    end
end
return claimed
"""


async def claim_due_jobs(
    pool: QueuePool, queue_name: str, wanted: int, in_progress_timeout_s: float, read_window: int
) -> list[tuple[str, int]]:
    """Claim up to ``wanted`` due jobs no worker runs: their ids and scores (enqueue times), oldest first."""
    claimed: list[bytes] = await pool.eval(  # type: ignore[misc]
        _CLAIM,
        1,
        queue_name,
        str(int(time.time() * 1000)),
        str(int(in_progress_timeout_s * 1000)),
        str(wanted),
        str(read_window),
        keys.ARQ_IN_PROGRESS_PREFIX,
        str(CHECK_BATCH),
    )
    return [
        (job_id.decode(), int(float(score)))
        for job_id, score in zip(claimed[::2], claimed[1::2], strict=True)
    ]
