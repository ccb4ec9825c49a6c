"""Owns the client side of arq: opening a JSON-serializing pool, enqueueing and aborting jobs.

arq is in maintenance mode upstream, so everything the gateway needs from it is
wrapped here (the worker side lives in ``worker/jobs.py``); replacing arq touches
these two modules only.
"""

from __future__ import annotations

import time

from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.constants import abort_jobs_ss

from shared import keys
from shared.codec import deserialize_arq_job, encode_job, serialize_arq_job
from shared.errors import InvalidRequest
from shared.protocol import GenerationJob

GENERATE_FUNCTION = "generate"


def redis_settings(url: str) -> RedisSettings:
    settings = RedisSettings.from_dsn(url)
    # Fail fast instead of arq's default of retrying the connection for seconds.
    settings.conn_timeout = 2
    settings.conn_retries = 0
    return settings


async def open_pool(url: str) -> ArqRedis:
    """An arq pool that is also a plain async Redis client (bytes replies)."""
    return await create_pool(
        redis_settings(url), job_serializer=serialize_arq_job, job_deserializer=deserialize_arq_job
    )


async def enqueue(pool: ArqRedis, job: GenerationJob, lane: keys.Lane = keys.Lane.INTERACTIVE) -> None:
    """Enqueue ``job`` under its request id; a duplicate id is refused, never run twice."""
    queued = await pool.enqueue_job(
        GENERATE_FUNCTION,
        encode_job(job),
        _job_id=job.request_id,
        _queue_name=keys.queue(job.model, lane),
    )
    if queued is None:
        raise InvalidRequest(f"request id {job.request_id} was already submitted")


async def abort(pool: ArqRedis, request_id: str) -> None:
    """Ask whichever worker holds ``request_id`` to cancel it (or drop it before it starts)."""
    await pool.zadd(abort_jobs_ss, {request_id: int(time.time() * 1000)})
