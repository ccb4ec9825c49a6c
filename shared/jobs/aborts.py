"""Owns arq's abort set (``keys.ARQ_ABORTS``) from both sides: adding aborts, kept to recent
entries of live jobs; taking back jobs no worker claimed; and the workers' reads of what is new.

arq's own abort grows its set without bound: every abort adds an entry, whether the job
runs, never will, or has ended, and arq's trim at each read removes nothing (it drops
scores *above* now + ``abort_job_max_age``), while every worker reads the whole set at
every poll. Here the writer trims entries older than ``keys.ABORTS_MAX_AGE_S`` in the
same script, adds none for an attempt that has ended (its arq job key is gone), and a job
refused at enqueue is withdrawn instead of aborted; workers read only the entries scored
since their last read. Scores are Redis's clock (``TIME`` inside the scripts), so gateways'
and workers' clocks never have to agree.
"""

from __future__ import annotations

from shared import keys
from shared.jobs.arq_seam import QueuePool

# The abort as one script, scored by Redis's clock (the worker reads by the same clock): the
# cancellation flag; entries older than ARGV[3] ms trimmed; then an entry for the request's
# first attempt and its current one (the run record's), each only while arq still holds the
# attempt's job (an ended attempt's job key is gone, so an entry would be read by no one).
# Keys: cancelled flag, abort set, run record. Args: request id, cancelled TTL, max age ms,
# job key prefix, attempt separator. Returns how many entries were added.
_ABORT = """
redis.call('SET', KEYS[1], '1', 'EX', ARGV[2])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now_ms - tonumber(ARGV[3])))
local job_ids = {ARGV[1]}
local attempt = tonumber(redis.call('HGET', KEYS[3], 'attempt') or '0')
if attempt > 0 then job_ids[2] = ARGV[1] .. ARGV[5] .. attempt end
local added = 0
for _, job_id in ipairs(job_ids) do
    if redis.call('EXISTS', ARGV[4] .. job_id) == 1 then
        redis.call('ZADD', KEYS[2], now_ms, job_id)
        added = added + 1
    end
end
return added
"""

# Takes back a job no worker has claimed: its queue entry and job key go, so it never runs and
# needs no abort. Keys: queue, in-progress key, job key. Returns 1 if withdrawn, 0 if claimed.
_WITHDRAW = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[3])
return 1
"""


async def abort(pool: QueuePool, request_id: str) -> None:
    """Ask whichever worker holds ``request_id`` (whatever its attempt) to cancel it, or drop it unstarted.

    The cancellation flag stops a worker from starting the request, or a takeover from
    resuming it, later; arq's abort set cancels the attempt running now at the worker's
    next poll, which the message on ``keys.ABORTS_CHANNEL`` triggers at once. An attempt
    that already ended gets no entry and no message, and entries older than
    ``keys.ABORTS_MAX_AGE_S`` are trimmed here: the set holds only recent aborts of live jobs.
    """
    added = await pool.eval(  # type: ignore[misc]
        _ABORT,
        3,
        keys.cancelled(request_id),
        keys.ARQ_ABORTS,
        keys.run(request_id),
        request_id,
        str(keys.CANCELLED_TTL_S),
        str(keys.ABORTS_MAX_AGE_S * 1000),
        keys.ARQ_JOB_PREFIX,
        keys.ATTEMPT_SEPARATOR,
    )
    if int(added):
        await pool.publish(keys.ABORTS_CHANNEL, request_id)


async def withdraw(
    pool: QueuePool, model: str, arq_job_id: str, lane: keys.Lane = keys.Lane.INTERACTIVE
) -> bool:
    """Take back a queued job no worker has claimed yet (True); False if one has (abort it then)."""
    withdrawn = await pool.eval(  # type: ignore[misc]
        _WITHDRAW,
        3,
        keys.queue(model, lane),
        keys.ARQ_IN_PROGRESS_PREFIX + arq_job_id,
        keys.ARQ_JOB_PREFIX + arq_job_id,
        arq_job_id,
    )
    return bool(int(withdrawn))


# The abort set's entries scored since ARGV[1] (ms, Redis's clock, as the abort script scores
# them) and no older than ARGV[2] ms, with Redis's now: a read sees only what is new.
_RECENT_ABORTS = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = math.max(tonumber(ARGV[1]), now_ms - tonumber(ARGV[2]))
return {now_ms, redis.call('ZRANGEBYSCORE', KEYS[1], since, '+inf')}
"""
# Re-read this much before the last read: harmless duplicates, against a clock step of Redis's.
_ABORTS_OVERLAP_MS = 1_000


async def recent_aborts(pool: QueuePool, read_at_ms: int) -> tuple[int, list[str]]:
    """Redis's now (ms) and the arq job ids aborted since ``read_at_ms`` (a previous now; 0 at first)."""
    now_ms, raw_ids = await pool.eval(  # type: ignore[misc]
        _RECENT_ABORTS,
        1,
        keys.ARQ_ABORTS,
        str(read_at_ms - _ABORTS_OVERLAP_MS),
        str(keys.ABORTS_MAX_AGE_S * 1000),
    )
    return int(now_ms), [raw.decode() for raw in raw_ids]
