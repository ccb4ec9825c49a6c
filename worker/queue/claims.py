"""Owns claiming due jobs from a lane's queue in one round trip, as arq claims them.

**One-trip polls** (a change over arq, for ``worker/queue/consumer.py``). arq keeps
running jobs in the queue's sorted set and, at every poll, checks each one it reads
with three round trips (WATCH, EXISTS, ZSCORE) before skipping it, then claims a
free one with a fourth; it also reads only ``queue_read_limit`` ids, oldest first.
With 32 sequences running, a poll every 50 ms cost ~100 round trips on the event
loop the engine shares (measured: 31 concurrent requests reached the engine ~1 s
after the first), and with more jobs running across workers than the read limit, a
new job was never seen at all. Here a poll is one script (``_CLAIM``): it reads a
wide window, skips jobs running anywhere, and claims as many free ones as this poll
may start, each exactly as arq claims it (its in-progress key), so arq runs them
unchanged. A wake-up to start a job thus costs one round trip, not five.
"""

from __future__ import annotations

import time

from shared import keys
from shared.jobs.arq_seam import QueuePool

# Queue ids read per poll: must exceed the jobs running across all workers of a lane,
# which stay in the queue's sorted set until they finish.
READ_WINDOW = 2048
# Claims up to ARGV[3] due jobs of queue KEYS[1] (oldest first) that no worker runs: arq's
# claim, an in-progress key (prefix ARGV[5]) living ARGV[2] ms. Returns id, score, id, score...
# ARGV[1] is now (ms), ARGV[4] the read window.
_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[4])
local wanted = tonumber(ARGV[3]) * 2
local claimed = {}
for i = 1, #due, 2 do
    if #claimed >= wanted then break end
    if redis.call('SET', ARGV[5] .. due[i], '1', 'NX', 'PX', ARGV[2]) then
        claimed[#claimed + 1] = due[i]
        claimed[#claimed + 1] = due[i + 1]
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
    )
    return [
        (job_id.decode(), int(float(score)))
        for job_id, score in zip(claimed[::2], claimed[1::2], strict=True)
    ]
