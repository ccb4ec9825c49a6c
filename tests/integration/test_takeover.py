"""A job picked by a worker that died before claiming it is released to run elsewhere, not stuck."""

from __future__ import annotations

import time

from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from shared.jobs import jobqueue
from shared.jobs.streams import EventReader
from shared.protocol import ChatMessage, ChatPrompt, GenerationJob, SamplingSpec
from tests.helpers import FAKE_MODEL, running_stack
from worker.queue.reaper import UNCLAIMED_GRACE_S, Reaper


async def test_a_job_picked_but_never_claimed_is_released_and_then_runs(redis_url: str, redis: Redis) -> None:
    job = GenerationJob(
        request_id=f"orphan-{time.monotonic_ns()}",
        model=FAKE_MODEL,
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content="Hi")]),
        sampling=SamplingSpec(max_tokens=4),
        created_at=time.time(),
    )
    async with running_stack(redis_url):
        pool = await jobqueue.open_pool(redis_url)
        try:
            # As arq leaves it when the worker that picked the job dies before our claim.
            await redis.set(in_progress_key_prefix + job.request_id, b"1", px=3_600_000)
            await jobqueue.enqueue(pool, job)
            reaper = Reaper(pool, FAKE_MODEL, interval_s=1.0)
            assert await reaper.release_unclaimed(now=0.0) == []  # seen once: maybe just picked
            assert await reaper.release_unclaimed(now=UNCLAIMED_GRACE_S) == [job.request_id]
            deadline = time.monotonic() + 30
            events = [item.event async for item in EventReader(pool).read(job.request_id, deadline=deadline)]
        finally:
            await pool.aclose()
    assert events[0].type == "accepted"
    assert events[-1].type == "finished"
