"""The one-script enqueue: arq reads the job it writes, a duplicate is refused, the place in line is right."""

from __future__ import annotations

import asyncio
import time

from arq.jobs import Job
from redis.asyncio import Redis

from shared import keys
from shared.codec import decode_job
from shared.jobs import jobqueue
from shared.protocol import ChatMessage, ChatPrompt, GenerationJob, SamplingSpec
from tests.helpers import FAKE_MODEL


def _job(request_id: str, lane: str = "interactive") -> GenerationJob:
    return GenerationJob(
        request_id=request_id,
        model=FAKE_MODEL,
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content="hello")]),
        sampling=SamplingSpec(max_tokens=4),
        created_at=time.time(),
        lane=lane,
    )


async def test_arq_reads_the_enqueued_job_and_a_duplicate_is_not_queued_twice(
    redis_url: str, redis: Redis
) -> None:
    pool = await jobqueue.open_pool(redis_url)
    try:
        job = _job(f"enqueue-{time.monotonic_ns()}")
        assert await jobqueue.enqueue(pool, job) == 0
        assert await jobqueue.enqueue(pool, job) == 0  # the same id: refused, not queued again
        assert await redis.zcard(keys.queue(FAKE_MODEL)) == 1
        info = await Job(
            job.request_id, pool, _queue_name=keys.queue(FAKE_MODEL), _deserializer=pool.job_deserializer
        ).info()
        assert info is not None and info.function == jobqueue.GENERATE_FUNCTION
        assert decode_job(info.args[0]) == job
        assert await redis.pttl(f"arq:job:{job.request_id}") > 23 * 3600 * 1000  # arq's default expiry
    finally:
        await pool.aclose()


async def test_place_in_line_counts_waiting_jobs_of_the_lane_but_not_claimed_ones(
    redis_url: str, redis: Redis
) -> None:
    pool = await jobqueue.open_pool(redis_url)
    try:
        stamp = time.monotonic_ns()
        first, second = _job(f"first-{stamp}"), _job(f"second-{stamp}")
        assert await jobqueue.enqueue(pool, first) == 0
        assert await jobqueue.enqueue(pool, second) == 1
        assert await jobqueue.enqueue(pool, _job(f"batch-{stamp}", lane="batch")) == 0  # its own lane
        await redis.sadd(keys.running(FAKE_MODEL), first.request_id)  # a worker claimed the first
        assert await jobqueue.enqueue(pool, _job(f"third-{stamp}")) == 1
    finally:
        await pool.aclose()


async def test_enqueue_wakes_workers_with_the_jobs_lane(redis_url: str) -> None:
    pool = await jobqueue.open_pool(redis_url)
    try:
        async with pool.pubsub() as pubsub:
            await pubsub.subscribe(keys.wake(FAKE_MODEL))
            await jobqueue.enqueue(pool, _job(f"wake-{time.monotonic_ns()}", lane="batch"))
            async with asyncio.timeout(5):
                while (
                    message := await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                ) is None:
                    pass
        assert message["data"] == b"batch"
    finally:
        await pool.aclose()
