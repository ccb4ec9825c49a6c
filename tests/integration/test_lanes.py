"""The batch lane: a worker runs batch-lane jobs in its spare capacity only, interactive requests first."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Literal

import pytest
from redis.asyncio import Redis

from shared import keys
from shared.jobs import jobqueue
from shared.jobs.streams import EventReader
from shared.protocol import ChatMessage, ChatPrompt, Delta, GenerationJob, SamplingSpec
from shared.settings import WorkerSettings
from tests.helpers import FAKE_MODEL, all_events, chat_body, running_stack, until_running
from worker.driver.engine_driver import DriverTuning
from worker.driver.lifecycle import JobLifecycle, StartedJob
from worker.engine import SequenceUpdate
from worker.engine.fake import FakeEngine


def _job(request_id: str, max_tokens: int, lane: Literal["interactive", "batch"]) -> GenerationJob:
    return GenerationJob(
        request_id=request_id,
        model=FAKE_MODEL,
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content="line")]),
        sampling=SamplingSpec(max_tokens=max_tokens, ignore_eos=True),
        created_at=time.time(),
        lane=lane,
    )


def _batch_job(request_id: str, max_tokens: int) -> GenerationJob:
    return _job(request_id, max_tokens, "batch")


async def test_batch_lane_jobs_fill_only_their_share_and_interactive_requests_still_start_at_once(
    redis_url: str, redis: Redis
) -> None:
    async with running_stack(redis_url, max_batch_size=4, batch_share=0.5, fake_step_delay_s=0.02) as client:
        pool = await jobqueue.open_pool(redis_url)
        try:
            jobs = [_batch_job(f"batch-{index}-{time.monotonic_ns()}", max_tokens=40) for index in range(6)]
            for job in jobs:
                await jobqueue.enqueue(pool, job)
            peak = 0
            started = time.monotonic()
            while time.monotonic() - started < 1.0:  # while the batch works, sample how many run
                peak = max(peak, int(await redis.scard(keys.running(FAKE_MODEL))))  # type: ignore[misc]
                await asyncio.sleep(0.02)
            assert 1 <= peak <= 2  # half of max_batch_size
            asked = time.monotonic()
            response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=3))
            assert response.status_code == 200
            assert time.monotonic() - asked < 2.0  # it did not wait for the batch lane's queue
            for job in jobs:
                assert (await all_events(pool, job.request_id))[-1].type == "finished"
        finally:
            await pool.aclose()


async def test_a_batch_lane_job_publishes_its_tokens_merged_and_an_interactive_one_per_step(
    redis_url: str, redis: Redis
) -> None:
    async with running_stack(redis_url, max_batch_size=4, fake_step_delay_s=0.01) as client:
        pool = await jobqueue.open_pool(redis_url)
        try:
            job = _batch_job(f"merged-{time.monotonic_ns()}", max_tokens=12)
            await jobqueue.enqueue(pool, job)
            events = await all_events(pool, job.request_id)
            streamed = await client.post("/v1/chat/completions", json=chat_body(max_tokens=12, stream=True))
        finally:
            await pool.aclose()
    deltas = [event for event in events if isinstance(event, Delta)]
    # 12 steps of 10 ms, well inside the 1 s hold: one merged delta, then the ends.
    assert [event.type for event in events] == ["accepted", "delta", "choice_finished", "finished"]
    assert len(deltas[0].token_ids) == 12
    assert streamed.text.count('"content"') > 6  # interactive: a chunk per step, not merged


async def test_no_batch_job_starts_while_an_interactive_request_waits_for_its_first_token(
    redis_url: str, redis: Redis
) -> None:
    async with running_stack(redis_url, max_batch_size=4, fake_step_delay_s=0.6) as client:
        pool = await jobqueue.open_pool(redis_url)
        try:
            interactive = asyncio.create_task(
                client.post("/v1/chat/completions", json=chat_body(max_tokens=2))
            )
            await until_running(redis, 1)  # its first step (0.6 s) is now under way
            job = _batch_job(f"waits-{time.monotonic_ns()}", max_tokens=2)
            await jobqueue.enqueue(pool, job)
            await asyncio.sleep(0.3)
            assert not await redis.exists(keys.run(job.request_id))  # not started: there was room
            assert (await interactive).status_code == 200
            events = await all_events(pool, job.request_id, timeout_s=30)
            assert events[-1].type == "finished"  # started once the interactive token was out
        finally:
            await pool.aclose()


def _stream_position(entry_id: str) -> tuple[int, int]:
    milliseconds, sequence = entry_id.split("-")
    return int(milliseconds), int(sequence)


async def test_batch_lane_tokens_wait_while_an_interactive_request_is_starting_and_none_is_lost(
    redis_url: str, redis: Redis
) -> None:
    unbounded = DriverTuning(max_deferred_steps=1000)  # its bound is not what this checks
    async with running_stack(
        redis_url, tuning=unbounded, max_batch_size=4, fake_step_delay_s=0.1, batch_hold_s=0
    ) as client:
        pool = await jobqueue.open_pool(redis_url)
        try:
            batch = _batch_job(f"deferred-{time.monotonic_ns()}", max_tokens=30)
            await jobqueue.enqueue(pool, batch)
            reader = EventReader(redis)
            async with asyncio.timeout(30):
                async for item in reader.read(batch.request_id, deadline=time.monotonic() + 30):
                    if item.event.type == "delta":
                        break  # the batch line is generating
            response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2, stream=True))
            assert response.status_code == 200
            interactive_id = response.headers["x-request-id"]
            batch_events = await all_events(pool, batch.request_id)

            interactive_events = await reader.history(interactive_id)
            accepted = next(item.entry_id for item in interactive_events if item.event.type == "accepted")
            first_token = next(item.entry_id for item in interactive_events if item.event.type == "delta")
            batch_history = await reader.history(batch.request_id)
            published_meanwhile = [
                item.entry_id
                for item in batch_history
                if item.event.type == "delta"
                and _stream_position(accepted)
                < _stream_position(item.entry_id)
                < _stream_position(first_token)
            ]
            # Steps ran meanwhile (the interactive one waited for the batch's step in flight),
            # but their batch tokens were routed only once the interactive token was out...
            assert published_meanwhile == []
            # ...and none was lost: the batch line has all its tokens, in order.
            text = "".join(event.text for event in batch_events if isinstance(event, Delta))
            assert text == WorkerSettings.model_fields["fake_script"].default[:30]
            assert batch_events[-1].type == "finished"
        finally:
            await pool.aclose()


@dataclass
class _Recorded:
    step_starts: list[float] = field(default_factory=list)
    admissions: list[tuple[float, float]] = field(default_factory=list)  # slow ones: (began, admitted)

    def steps_during_first_admission(self) -> list[float]:
        (began, admitted), *_ = self.admissions
        return [moment for moment in self.step_starts if began < moment < admitted]


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> _Recorded:
    """Step starts recorded, and interactive jobs' starts made 0.3 s slower (as tokenizing a long
    prompt would), except those whose id begins with ``quick-``."""
    record = _Recorded()
    step = FakeEngine.step
    start = JobLifecycle.start

    def recorded_step(engine: FakeEngine) -> list[SequenceUpdate]:
        record.step_starts.append(time.monotonic())
        return step(engine)

    async def slow_start(lifecycle: JobLifecycle, job: GenerationJob) -> StartedJob | None:
        if job.lane == "batch" or job.request_id.startswith("quick-"):
            return await start(lifecycle, job)
        began = time.monotonic()
        await asyncio.sleep(0.3)
        started = await start(lifecycle, job)
        record.admissions.append((began, time.monotonic()))
        return started

    monkeypatch.setattr(FakeEngine, "step", recorded_step)
    monkeypatch.setattr(JobLifecycle, "start", slow_start)
    return record


# With the slow starts of ``recorded``: the wait for an arriving request is made longer too.
_LONG_ARRIVAL_WAIT = DriverTuning(arrival_wait_s=2.0)


async def test_the_next_step_waits_for_an_interactive_request_being_admitted_beside_batch_rows(
    redis_url: str, redis: Redis, recorded: _Recorded
) -> None:
    """Started without it, the step would make the request wait a whole step more."""
    async with running_stack(
        redis_url, tuning=_LONG_ARRIVAL_WAIT, max_batch_size=4, fake_step_delay_s=0.05
    ) as client:
        pool = await jobqueue.open_pool(redis_url)
        try:
            batch = _batch_job(f"beside-{time.monotonic_ns()}", max_tokens=60)
            await jobqueue.enqueue(pool, batch)
            await until_running(redis, 1)
            response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2))
            assert response.status_code == 200
            assert recorded.steps_during_first_admission() == []  # six steps' worth: the batch rows waited
            assert (await all_events(pool, batch.request_id))[-1].type == "finished"
        finally:
            await pool.aclose()


async def test_no_step_waits_for_an_admission_while_an_interactive_request_streams(
    redis_url: str, redis: Redis, recorded: _Recorded
) -> None:
    async with running_stack(
        redis_url, tuning=_LONG_ARRIVAL_WAIT, max_batch_size=4, fake_step_delay_s=0.05
    ) as client:
        pool = await jobqueue.open_pool(redis_url)
        try:
            streaming = _job(f"quick-{time.monotonic_ns()}", max_tokens=60, lane="interactive")
            await jobqueue.enqueue(pool, streaming)
            reader = EventReader(redis)
            async for item in reader.read(streaming.request_id, deadline=time.monotonic() + 30):
                if item.event.type == "delta":
                    break  # it streams
            response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2))
            assert response.status_code == 200
            assert len(recorded.steps_during_first_admission()) >= 2  # its tokens kept coming (no 2 s wait)
        finally:
            await pool.aclose()
