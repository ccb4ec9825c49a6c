"""A reaper's sweep acts on exactly the records that need it: a dead owner's job is resumed, a
queued job past its deadline fails clearly, everything else (however many) is left alone."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from shared import keys, registry
from shared.codec import decode_event
from shared.jobs import jobqueue, run_records
from shared.protocol import ChatMessage, ChatPrompt, GenerationJob, SamplingSpec
from worker.queue.reaper import Reaper

MODEL = "sweep-model"
ALIVE, DEAD = "worker-alive", "worker-dead"


def _job(request_id: str, deadline_at: float | None = None) -> GenerationJob:
    return GenerationJob(
        request_id=request_id,
        model=MODEL,
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content="hello")]),
        sampling=SamplingSpec(max_tokens=4),
        created_at=time.time(),
        deadline_at=deadline_at,
    )


async def _queued(pool: jobqueue.QueuePool, job: GenerationJob) -> None:
    """A record handed back to the queue for its next attempt, as a draining worker leaves it."""
    assert await run_records.begin(pool, job, ALIVE) is run_records.Claim.OK
    assert await run_records.hand_over(pool, job, ALIVE) == 1


async def _owner(redis: Redis, job: GenerationJob) -> tuple[bytes | None, bytes | None]:
    owner, attempt = await redis.hmget(keys.run(job.request_id), ["owner", "attempt"])  # type: ignore[misc]
    return owner, attempt


async def test_a_sweep_resumes_dead_owners_jobs_expires_late_queued_ones_and_leaves_the_rest(
    redis_url: str, redis: Redis
) -> None:
    pool = await jobqueue.open_pool(redis_url)
    try:
        await registry.heartbeat(
            pool, registry.WorkerInfo(worker_id=ALIVE, model=MODEL, max_model_len=64, started_at=time.time())
        )
        running = [_job(f"running-{index}") for index in range(50)]
        for job in running:
            assert await run_records.begin(pool, job, ALIVE) is run_records.Claim.OK
        orphaned = _job("orphaned")
        assert await run_records.begin(pool, orphaned, DEAD) is run_records.Claim.OK
        waiting = _job("waiting", deadline_at=time.time() + 600)
        await _queued(pool, waiting)
        late = _job("late", deadline_at=time.time() - 1)
        await _queued(pool, late)
        # A record written before records kept their deadline beside the job: read from the job.
        late_old = _job("late-old", deadline_at=time.time() - 1)
        await _queued(pool, late_old)
        await redis.hdel(keys.run(late_old.request_id), "deadline")  # type: ignore[misc]
        await redis.sadd(keys.running(MODEL), "expired-record")  # type: ignore[misc]

        assert await Reaper(pool, MODEL, interval_s=1.0).sweep() == 1

        for job in running:
            assert await _owner(redis, job) == (run_records.owner_token(ALIVE, 0).encode(), b"0")
        assert await _owner(redis, waiting) == (b"", b"1")
        assert await _owner(redis, orphaned) == (b"", b"1")  # queued for attempt 1 ...
        queued = await redis.zrange(keys.queue(MODEL), 0, -1)
        assert keys.attempt_job_id(orphaned.request_id, 1).encode() in queued  # ... and enqueued
        for job in (late, late_old):
            assert await redis.exists(keys.run(job.request_id)) == 0
            entries = await redis.xrange(keys.events(job.request_id))
            assert decode_event(entries[-1][1]).type == "failed"
        members = await redis.smembers(keys.running(MODEL))  # type: ignore[misc]
        assert b"expired-record" not in members
        assert len(members) == len(running) + 2  # the running ones, the waiting one, the orphaned one
    finally:
        await pool.aclose()


async def test_only_jobs_arq_started_and_nobody_claimed_count_as_unclaimed(
    redis_url: str, redis: Redis
) -> None:
    pool = await jobqueue.open_pool(redis_url)
    try:
        picked, claimed, waiting = _job("picked"), _job("claimed"), _job("waiting")
        resumed = _job("resumed").model_copy(update={"attempt": 2})
        for job in (picked, claimed, waiting, resumed):
            await jobqueue.enqueue(pool, job)
        for job in (picked, claimed, resumed):
            job_id = keys.attempt_job_id(job.request_id, job.attempt)
            await redis.set(keys.ARQ_IN_PROGRESS_PREFIX + job_id, b"1", px=60_000)
        assert await run_records.begin(pool, claimed, ALIVE) is run_records.Claim.OK
        unclaimed = await jobqueue.unclaimed_in_progress(pool, MODEL)
        assert sorted(unclaimed) == sorted([picked.request_id, keys.attempt_job_id(resumed.request_id, 2)])
    finally:
        await pool.aclose()


async def test_the_workers_of_a_model_take_turns_to_sweep_one_interval_each(redis_url: str) -> None:
    pool = await jobqueue.open_pool(redis_url)
    try:
        first, second = (
            Reaper(pool, MODEL, interval_s=0.3, worker_id=worker_id) for worker_id in ("reaper-a", "reaper-b")
        )
        other_model = Reaper(pool, "other-model", interval_s=0.3, worker_id="reaper-c")
        assert await first.take_turn()
        assert not await second.take_turn()  # the same interval: one sweep finds what both would
        assert await other_model.take_turn()  # each model's workers take their own turns
        await asyncio.sleep(0.4)
        assert await second.take_turn()  # the next interval: whoever asks first
    finally:
        await pool.aclose()
