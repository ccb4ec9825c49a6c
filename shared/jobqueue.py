"""Owns the client side of arq: opening a JSON-serializing pool, enqueueing and aborting jobs.

arq is in maintenance mode upstream, so everything the gateway needs from it is
wrapped here (the worker side lives in ``worker/jobs.py``); replacing arq touches
these two modules only.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.constants import abort_jobs_ss, in_progress_key_prefix, job_key_prefix, retry_key_prefix
from redis.connection import SSLConnection, parse_url

from shared import keys
from shared.codec import deserialize_arq_job, encode_job, serialize_arq_job
from shared.errors import InvalidRequest
from shared.protocol import GenerationJob, TokenizeJob

GENERATE_FUNCTION = "generate"
TOKENIZE_FUNCTION = "tokenize"
# TLS options a rediss:// URL may carry as query parameters, named as both libraries name them.
_TLS_OPTIONS = {"ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_check_hostname"}


def redis_settings(url: str) -> RedisSettings:
    """arq's connection settings for ``url``, read exactly as ``redis.asyncio.Redis.from_url`` reads it.

    arq's own ``from_dsn`` leaves a percent-encoded password encoded and drops TLS
    query options; redis-py's parser handles both (``rediss://:p%40ss@host/0?ssl_cert_reqs=none``).
    """
    parsed: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    settings = RedisSettings(
        host=parsed.get("host", "localhost"),
        port=parsed.get("port", 6379),
        unix_socket_path=parsed.get("path"),
        database=parsed.get("db", 0),
        username=parsed.get("username"),
        password=parsed.get("password"),
        ssl=parsed.get("connection_class") is SSLConnection,
    )
    for option in _TLS_OPTIONS & parsed.keys():
        setattr(settings, option, parsed[option])
    # Fail fast instead of arq's default of retrying the connection for seconds.
    settings.conn_timeout = 2
    settings.conn_retries = 0
    return settings


def redacted_url(url: str) -> str:
    """``url`` with its password masked, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


async def open_pool(url: str, *, socket_timeout_s: float | None = None) -> ArqRedis:
    """An arq pool that is also a plain async Redis client (bytes replies).

    With ``socket_timeout_s`` every call fails after that long instead of hanging
    on a Redis that stopped answering (arq's own pool sets no socket timeout);
    blocking reads must block for less.
    """
    pool = await create_pool(
        redis_settings(url), job_serializer=serialize_arq_job, job_deserializer=deserialize_arq_job
    )
    if socket_timeout_s is not None:
        pool.connection_pool.connection_kwargs["socket_timeout"] = socket_timeout_s
        await pool.connection_pool.disconnect()  # the start-up ping's connection had no timeout
    return pool


async def enqueue(pool: ArqRedis, job: GenerationJob, lane: keys.Lane = keys.Lane.INTERACTIVE) -> None:
    """Enqueue ``job`` (one attempt of its request) and wake an idle worker of its model at once.

    A duplicate id is refused, never run twice. The wake-up is what keeps time to
    first token independent of arq's poll interval (``worker/queue_worker.py``).
    """
    queued = await pool.enqueue_job(
        GENERATE_FUNCTION,
        encode_job(job),
        _job_id=keys.attempt_job_id(job.request_id, job.attempt),
        _queue_name=keys.queue(job.model, lane),
    )
    if queued is None:
        raise InvalidRequest(f"request id {job.request_id} was already submitted")
    await pool.publish(keys.wake(job.model), lane.value)


async def abort(pool: ArqRedis, request_id: str) -> None:
    """Ask whichever worker holds ``request_id`` (whatever its attempt) to cancel it, or drop it unstarted.

    The cancellation flag stops a takeover from resuming the request later; arq's
    abort set cancels the attempt running now within one poll.
    """
    now_ms = int(time.time() * 1000)
    async with pool.pipeline(transaction=False) as pipe:
        pipe.set(keys.cancelled(request_id), b"1", ex=keys.CANCELLED_TTL_S)
        pipe.zadd(abort_jobs_ss, {request_id: now_ms})
        pipe.hget(keys.run(request_id), "attempt")
        *_, attempt = await pipe.execute()
    if attempt is not None and int(attempt) > 0:
        await pool.zadd(abort_jobs_ss, {keys.attempt_job_id(request_id, int(attempt)): now_ms})


async def forget(
    pool: ArqRedis, model: str, arq_job_id: str, lane: keys.Lane = keys.Lane.INTERACTIVE
) -> None:
    """Drop arq's records of an attempt whose worker died, so it neither counts as queued nor reruns."""
    async with pool.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.queue(model, lane), arq_job_id)
        pipe.delete(
            in_progress_key_prefix + arq_job_id, job_key_prefix + arq_job_id, retry_key_prefix + arq_job_id
        )
        await pipe.execute()


async def place_in_line(pool: ArqRedis, job: GenerationJob, lane: keys.Lane = keys.Lane.INTERACTIVE) -> int:
    """How many jobs of the model wait ahead of ``job`` (queued, not yet claimed by a worker).

    arq keeps running jobs in the queue too; jobs workers have claimed are in the
    model's running set, and they are the oldest, so they are subtracted.
    """
    async with pool.pipeline(transaction=False) as pipe:
        pipe.zrank(keys.queue(job.model, lane), keys.attempt_job_id(job.request_id, job.attempt))
        pipe.scard(keys.running(job.model))
        rank, running = await pipe.execute()
    return 0 if rank is None else max(0, int(rank) - int(running))


async def enqueue_tokenize(pool: ArqRedis, job: TokenizeJob) -> None:
    """Enqueue a tokenize/detokenize job on its model's interactive queue (any worker of it answers)."""
    queued = await pool.enqueue_job(
        TOKENIZE_FUNCTION,
        job.model_dump(mode="json"),
        _job_id=job.request_id,
        _queue_name=keys.queue(job.model, keys.Lane.INTERACTIVE),
    )
    if queued is None:
        raise InvalidRequest(f"request id {job.request_id} was already submitted")
    await pool.publish(keys.wake(job.model), keys.Lane.INTERACTIVE.value)
