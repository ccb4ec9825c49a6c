"""Owns the run table: who runs each accepted job, and the atomic moves that hand a job to another worker.

arq's own in-progress marker lives ``job_timeout + 10 s`` and is never refreshed,
so a SIGKILLed worker's job would wait minutes (or forever, with ``max_tries=1``).
Instead every accepted job has a run record (``keys.run``) naming its owner as
``"<worker_id>/<attempt>"``, beside the job and its deadline; the owner's liveness key
(``keys.worker``, refreshed by its heartbeat) is the lease. When the lease lapses, any
live worker of the model (``worker/queue/reaper.py``) moves the record to "queued" with
the next attempt number and enqueues a resume job; the worker that picks it up claims
the record and continues the stream from the events already in it
(``worker/driver/resume.py``).

Every transition is one Lua script, so two reapers, a late owner and a
cancelling client can race without a job running twice or being lost:

``begin``      nobody → owner (attempt 0), or queued → owner (attempt k)
``hand_over``  owner → queued (attempt + 1): a draining worker giving work back
``orphan``     dead owner → queued (attempt + 1), or gone if cancelled / past deadline
The owner's publishing is fenced by the same record (``shared/jobs/streams.py``): a
worker that lost its job (a lease that lapsed under load) cannot write into a
stream somebody else now continues. A terminal event deletes the record in the
same script that stores it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

from redis.asyncio import Redis

from shared import keys
from shared.codec import CodecError
from shared.protocol import GenerationJob

QUEUED = ""  # the owner of a record waiting in the queue for its next attempt


class Claim(StrEnum):
    OK = "ok"
    STALE = "stale"  # another attempt owns or owned the record: this one must not run
    CANCELLED = "cancelled"


class Orphaning(StrEnum):
    REQUEUED = "requeued"
    RACED = "raced"  # the record changed since it was read (its owner came back, or another reaper won)
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # the deadline passed: nobody waits any more
    WAITING = "waiting"  # queued for its next attempt, still in time


def owner_token(worker_id: str, attempt: int) -> str:
    return f"{worker_id}/{attempt}"


def owner_worker(token: str) -> str:
    return token.rpartition("/")[0]


_BEGIN = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 'cancelled' end
local attempt = tonumber(ARGV[2])
local current = redis.call('HGET', KEYS[1], 'attempt')
if attempt == 0 then
  if current then return 'stale' end
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'attempt', 0, 'job', ARGV[3], 'deadline', ARGV[6])
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('SADD', KEYS[2], ARGV[5])
  return 'ok'
end
if tonumber(current) ~= attempt or redis.call('HGET', KEYS[1], 'owner') ~= '' then return 'stale' end
redis.call('HSET', KEYS[1], 'owner', ARGV[1])
return 'ok'
"""

_HAND_OVER = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'owner', '')
return redis.call('HINCRBY', KEYS[1], 'attempt', 1)
"""

_END = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
"""

_ORPHAN = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 'raced' end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('DEL', KEYS[1]); redis.call('SREM', KEYS[2], ARGV[2]); return 'cancelled'
end
if tonumber(ARGV[3]) > 0 and tonumber(ARGV[3]) < tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[1]); redis.call('SREM', KEYS[2], ARGV[2]); return 'expired'
end
if ARGV[1] == '' then return 'waiting' end
redis.call('HSET', KEYS[1], 'owner', '')
redis.call('HINCRBY', KEYS[1], 'attempt', 1)
return 'requeued'
"""


@dataclass(frozen=True, slots=True)
class RunRecord:
    request_id: str
    owner: str  # an owner token, or QUEUED
    attempt: int
    job: GenerationJob

    @property
    def is_queued(self) -> bool:
        return self.owner == QUEUED

    def resume_job(self) -> GenerationJob:
        """The job for this record's current attempt."""
        return self.job.model_copy(update={"attempt": self.attempt})


async def begin(redis: Redis, job: GenerationJob, worker_id: str) -> Claim:
    """Claim ``job`` (any attempt) for ``worker_id`` before running it."""
    result = await redis.eval(  # type: ignore[misc]
        _BEGIN,
        3,
        keys.run(job.request_id),
        keys.running(job.model),
        keys.cancelled(job.request_id),
        owner_token(worker_id, job.attempt),
        str(job.attempt),
        job.model_dump_json(),
        str(keys.RUN_TTL_S),
        job.request_id,
        repr(job.deadline_at or 0.0),
    )
    return Claim(_text(result))


async def hand_over(redis: Redis, job: GenerationJob, worker_id: str) -> int | None:
    """Give a running job back to the queue; the next attempt's number, or None if no longer ours."""
    attempt = int(
        await redis.eval(  # type: ignore[misc]
            _HAND_OVER, 1, keys.run(job.request_id), owner_token(worker_id, job.attempt)
        )
    )
    return None if attempt < 0 else attempt


async def end(redis: Redis, job: GenerationJob, worker_id: str) -> None:
    """Forget a job that ends without a terminal event (its client aborted it), if still ours."""
    await redis.eval(  # type: ignore[misc]
        _END,
        2,
        keys.run(job.request_id),
        keys.running(job.model),
        owner_token(worker_id, job.attempt),
        job.request_id,
    )


async def orphan(redis: Redis, record: RunRecord, now: float | None = None) -> Orphaning:
    """Take ``record`` from its dead owner (or drop it, if cancelled or past its deadline)."""
    deadline = record.job.deadline_at or 0.0
    result = await redis.eval(  # type: ignore[misc]
        _ORPHAN,
        3,
        keys.run(record.request_id),
        keys.running(record.job.model),
        keys.cancelled(record.request_id),
        record.owner,
        record.request_id,
        repr(deadline),
        repr(time.time() if now is None else now),
    )
    return Orphaning(_text(result))


# The members of a model's running set that may need a reaper: an owner whose liveness key
# expired, or a queued record past its deadline (or of unknown deadline: written before records
# kept one). Index members whose record expired are pruned. Reads two short fields per record
# and each owner's liveness once, in the server, so a sweep of thousands of healthy records
# sends back none of their jobs.
_CANDIDATES = """
local now = tonumber(ARGV[3])
local found, gone, alive = {}, {}, {}
for _, request_id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local row = redis.call('HMGET', ARGV[1] .. request_id, 'owner', 'deadline')
  local owner, deadline = row[1], tonumber(row[2])
  if not owner then
    gone[#gone + 1] = request_id
  elseif owner == '' then
    if deadline == nil or (deadline > 0 and deadline < now) then found[#found + 1] = request_id end
  else
    local worker = string.match(owner, '^(.*)/') or owner
    if alive[worker] == nil then alive[worker] = redis.call('EXISTS', ARGV[2] .. worker) == 1 end
    if not alive[worker] then found[#found + 1] = request_id end
  end
end
if #gone > 0 then redis.call('SREM', KEYS[1], unpack(gone)) end
return found
"""


async def reaping_candidates(redis: Redis, model: str, now: float | None = None) -> list[RunRecord]:
    """The run records of ``model`` a reaper may have to act on: owned by a worker whose
    liveness key expired, or queued and past their deadline. Only these are read whole."""
    found: list[bytes] = await redis.eval(  # type: ignore[misc]
        _CANDIDATES,
        1,
        keys.running(model),
        keys.run(""),
        keys.worker(""),
        repr(time.time() if now is None else now),
    )
    request_ids = sorted(_text(member) for member in found)
    if not request_ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for request_id in request_ids:
            pipe.hmget(keys.run(request_id), ["owner", "attempt", "job"])
        rows = await pipe.execute()
    records = (_record(request_id, *row) for request_id, row in zip(request_ids, rows, strict=True))
    return [record for record in records if record is not None]  # None: ended since


async def current_attempt(redis: Redis, request_id: str) -> int | None:
    value = await redis.hget(keys.run(request_id), "attempt")  # type: ignore[misc]
    return None if value is None else int(value)


def _record(request_id: str, owner: object, attempt: object, job: object) -> RunRecord | None:
    if owner is None or attempt is None or job is None:
        return None
    try:
        parsed = GenerationJob.model_validate_json(job)  # type: ignore[arg-type]
    except ValueError as error:
        raise CodecError(f"unreadable run record for {request_id}: {error}") from error
    return RunRecord(request_id, _text(owner), int(_text(attempt)), parsed)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
