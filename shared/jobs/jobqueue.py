"""Owns the client side of the queue: opening a JSON-serializing pool, enqueueing and aborting jobs.

Everything the gateway (and a worker handing a job on) does to the queue is here. arq
is reached only through ``shared/jobs/arq_seam.py``, which lists what this module
relies on (arq's key layout, its job payload, its abort set) and what it does instead
(one enqueue script, aborts announced, the clean-up of dead attempts). Aborting is
``shared/jobs/aborts.py``'s (the abort set, kept bounded), re-exported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared import keys, redis_connect
from shared.codec import deserialize_arq_job, encode_job, serialize_arq_job
from shared.jobs.aborts import abort as abort  # re-exported: the queue's callers cancel jobs here
from shared.jobs.aborts import withdraw as withdraw
from shared.jobs.arq_seam import QueuePool, RedisSettings, create_pool, serialize_job
from shared.protocol import GenerationJob, TokenizeJob
from shared.redis_url import redacted_url as redacted_url  # re-exported: the CLI's messages mask with it

logger = logging.getLogger(__name__)

GENERATE_FUNCTION = "generate"
TOKENIZE_FUNCTION = "tokenize"


def redis_settings(url: str) -> RedisSettings:
    """arq's connection settings for ``url`` (either form: ``shared/redis_connect.py``)."""
    return redis_connect.arq_settings(url)


async def open_pool(
    url: str,
    *,
    connect_timeout_s: float | None = None,
    max_connections: int | None = None,
    wait_s: float = 2.0,
) -> QueuePool:
    """An arq pool that is also a plain async Redis client (bytes replies).

    ``connect_timeout_s`` bounds each (re)connection, so a Redis that is down answers
    at once. There is deliberately no socket (read) timeout: with one, redis-py at
    times lost a cancellation that landed mid-read, leaving abandoned requests and
    shutdowns hanging; a Redis that stalls with its connections open is therefore
    not detected (see the README).

    With ``max_connections`` (the gateway's), the pool opens at most that many
    connections, and a command that finds them all busy for ``wait_s`` raises redis-py's
    ``ConnectionError`` ("No connection available."), which the gateway answers 503.
    """
    if max_connections is None:
        settings = redis_settings(url)
        if connect_timeout_s is not None:
            settings.conn_timeout = connect_timeout_s  # type: ignore[assignment]  # arq types it int
        return await create_pool(
            settings, job_serializer=serialize_arq_job, job_deserializer=deserialize_arq_job
        )
    connections = redis_connect.blocking_pool(
        url, max_connections=max_connections, timeout=wait_s, socket_connect_timeout=connect_timeout_s or 2
    )
    pool = QueuePool(connections, job_serializer=serialize_arq_job, job_deserializer=deserialize_arq_job)
    pool.auto_close_connection_pool = True  # the pool is this client's: closing it closes them
    try:
        await pool.ping()  # fail fast, as arq's create_pool does
    except BaseException:
        await pool.aclose()
        raise
    return pool


# arq's enqueue (a job key, refused when the id exists, plus the queue entry) as one script,
# with the wake-up and the job's place in line: one round trip instead of arq's three plus two.
# Keys: job, result, queue, running set. Args: job bytes, expiry ms, score, job id, channel
# ('' for no wake-up), lane.
_ENQUEUE = """
local is_new = 0
if redis.call('EXISTS', KEYS[1], KEYS[2]) == 0 then
    redis.call('PSETEX', KEYS[1], ARGV[2], ARGV[1])
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
    is_new = 1
end
if ARGV[5] ~= '' then
    redis.call('PUBLISH', ARGV[5], ARGV[6])
end
local rank = redis.call('ZRANK', KEYS[3], ARGV[4])
return {is_new, rank or -1, redis.call('SCARD', KEYS[4])}
"""


@dataclass(frozen=True, slots=True)
class _QueuedJob:
    """One arq job as the enqueue script takes it."""

    function: str
    argument: Any
    job_id: str
    model: str
    lane: keys.Lane

    @classmethod
    def of(cls, job: GenerationJob, lane: keys.Lane | None) -> _QueuedJob:
        """``job`` on ``lane`` (default its own); the lane is recorded on the job, so a takeover
        re-enqueues it on the same lane."""
        if lane is not None and lane.value != job.lane:
            job = job.model_copy(update={"lane": lane.value})
        job_id = keys.attempt_job_id(job.request_id, job.attempt)
        return cls(GENERATE_FUNCTION, encode_job(job), job_id, job.model, keys.Lane(job.lane))

    def script_call(self, pool: QueuePool, *, wake: bool) -> tuple[list[str], list[Any]]:
        """The enqueue script's keys and arguments for this job."""
        now_ms = int(time.time() * 1000)
        payload = serialize_job(
            self.function, (self.argument,), {}, None, now_ms, serializer=pool.job_serializer
        )
        script_keys = [
            keys.ARQ_JOB_PREFIX + self.job_id,
            keys.ARQ_RESULT_PREFIX + self.job_id,
            keys.queue(self.model, self.lane),
            keys.running(self.model),
        ]
        args = [
            payload,
            str(pool.expires_extra_ms),
            str(now_ms),
            self.job_id,
            keys.wake(self.model) if wake else "",
            self.lane.value,
        ]
        return script_keys, args

    def place_in_line(self, reply: list[int]) -> int:
        """How many jobs wait ahead, from the script's reply (claimed jobs are not waiting)."""
        is_new, rank, running = reply
        if not is_new:
            # Ids are generated by us and never reused, so an existing job is this very one: a
            # retried command whose first reply was lost (a Redis restart) already enqueued it.
            logger.info("job %s was enqueued already", self.job_id)
        return 0 if rank < 0 else max(0, int(rank) - int(running))


async def enqueue(pool: QueuePool, job: GenerationJob, lane: keys.Lane | None = None) -> int:
    """Enqueue ``job`` (one attempt of its request) on its lane (``lane`` overrides it), wake
    idle workers of its model, and return how many of the model's jobs wait ahead of it.

    A duplicate id is refused, never run twice. The wake-up is what keeps time to
    first token independent of arq's poll interval (``worker/queue/consumer.py``).
    arq keeps running jobs in its queue too; jobs workers have claimed are in the
    model's running set, and they are the oldest, so they are not counted as ahead.
    """
    return await _enqueue(pool, _QueuedJob.of(job, lane))


async def enqueue_many(pool: QueuePool, jobs: Sequence[GenerationJob], lane: keys.Lane) -> None:
    """Enqueue ``jobs`` on ``lane`` in one round trip, waking each model's workers once.

    For the batch runner's top-ups: a wake-up per job made every worker poll once per job.
    """
    queued = [_QueuedJob.of(job, lane) for job in jobs]
    if not queued:
        return
    script = pool.register_script(_ENQUEUE)  # EVALSHA: the script's text is not sent per job
    async with pool.pipeline(transaction=False) as pipe:
        for item in queued:
            script_keys, args = item.script_call(pool, wake=False)
            await script(script_keys, args, client=pipe)
        for model in dict.fromkeys(item.model for item in queued):
            pipe.publish(keys.wake(model), lane.value)
        replies = await pipe.execute()
    for item, reply in zip(queued, replies[: len(queued)], strict=True):
        item.place_in_line(reply)


async def _enqueue(pool: QueuePool, item: _QueuedJob) -> int:
    script_keys, args = item.script_call(pool, wake=True)
    reply = await pool.register_script(_ENQUEUE)(script_keys, args)
    return item.place_in_line(reply)


async def forget(
    pool: QueuePool, model: str, arq_job_id: str, lane: keys.Lane = keys.Lane.INTERACTIVE
) -> None:
    """Drop arq's records of an attempt whose worker died, so it neither counts as queued nor reruns."""
    async with pool.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.queue(model, lane), arq_job_id)
        pipe.delete(
            keys.ARQ_IN_PROGRESS_PREFIX + arq_job_id,
            keys.ARQ_JOB_PREFIX + arq_job_id,
            keys.ARQ_RETRY_PREFIX + arq_job_id,
        )
        await pipe.execute()


# arq job ids in a model's queues that arq marks running while no run record claims them, found
# in the server: a sweep of a long queue sends back only those, not every queued id.
_UNCLAIMED = """
local found = {}
for _, queue in ipairs(KEYS) do
  for _, job_id in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    local cut = string.find(job_id, ARGV[3], 1, true)  -- keys.request_id_of_job
    local request_id = cut and string.sub(job_id, 1, cut - 1) or job_id
    -- claimed first: most jobs in a queue are running ones, whose record answers alone
    if redis.call('EXISTS', ARGV[2] .. request_id) == 0 and redis.call('EXISTS', ARGV[1] .. job_id) == 1 then
      found[#found + 1] = job_id
    end
  end
end
return found
"""


async def unclaimed_in_progress(pool: QueuePool, model: str) -> list[str]:
    """arq job ids of ``model`` that arq marks running while no run record claims them.

    A worker claims a job (``shared/jobs/run_records.py``) as soon as it starts it, so one that
    stays like this was picked by a worker that died in between.
    """
    found: list[bytes] = await pool.eval(  # type: ignore[misc]
        _UNCLAIMED,
        len(keys.Lane),
        *[keys.queue(model, lane) for lane in keys.Lane],
        keys.ARQ_IN_PROGRESS_PREFIX,
        keys.run(""),
        keys.ATTEMPT_SEPARATOR,
    )
    return [job_id.decode() for job_id in found]


async def release(pool: QueuePool, arq_job_id: str) -> None:
    """Let arq start a job again, as its first try, whose worker died before claiming it."""
    await pool.delete(keys.ARQ_IN_PROGRESS_PREFIX + arq_job_id, keys.ARQ_RETRY_PREFIX + arq_job_id)


async def enqueue_tokenize(pool: QueuePool, job: TokenizeJob) -> None:
    """Enqueue a tokenize/detokenize job on its model's interactive queue (any worker of it answers)."""
    await _enqueue(
        pool,
        _QueuedJob(
            TOKENIZE_FUNCTION, job.model_dump(mode="json"), job.request_id, job.model, keys.Lane.INTERACTIVE
        ),
    )
