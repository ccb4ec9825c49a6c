"""The worker's queue poll: it finds new jobs behind many running ones, and does not re-check its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from arq import func
from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from shared import keys
from shared.jobs import jobqueue
from tests.helpers import FAKE_MODEL, chat_body, running_stack, until_running
from worker.queue.claims import READ_WINDOW, claim_due_jobs
from worker.queue.consumer import QueueWorker


async def test_a_new_job_starts_behind_more_running_jobs_than_arq_reads_per_poll(
    redis_url: str, redis: Redis
) -> None:
    # 300 older jobs "running on other workers": arq alone reads max_jobs ids per poll (oldest
    # first), would find only running ones and never see the new request behind them.
    queue = keys.queue(FAKE_MODEL)
    for index in range(300):
        job_id = f"elsewhere-{index}"
        await redis.zadd(queue, {job_id: 1 + index})
        await redis.set(in_progress_key_prefix + job_id, b"1", px=60_000)
    # (The gateway counts them as waiting: they have no run records. Its queue bound is not under test.)
    async with running_stack(redis_url, gateway={"max_queued_requests": 1000}, max_batch_size=4) as client:
        response = await asyncio.wait_for(
            client.post("/v1/chat/completions", json=chat_body(max_tokens=3)), timeout=10
        )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3


async def test_polls_do_not_recheck_the_jobs_this_worker_runs(redis_url: str, redis: Redis) -> None:
    async with running_stack(redis_url, max_batch_size=8, fake_step_delay_s=0.05) as client:
        requests = [
            asyncio.create_task(client.post("/v1/chat/completions", json=chat_body(max_tokens=40)))
            for _ in range(8)
        ]
        await until_running(redis, 8)
        watches_before = await _calls(redis, "watch")
        await asyncio.sleep(1.0)  # ~100 polls at the tests' 10 ms poll delay
        watches_during = await _calls(redis, "watch") - watches_before
        responses = await asyncio.gather(*requests)
    assert all(response.status_code == 200 for response in responses)
    # arq's own poll WATCHes every running job it reads: 8 jobs x ~100 polls.
    assert watches_during == 0


async def _calls(redis: Redis, command: str) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_close_completes_the_shutdown_even_when_a_job_task_ends_cancelled(redis_url: str) -> None:
    shut_down: list[bool] = []

    async def on_shutdown(ctx: dict[str, object]) -> None:
        shut_down.append(True)

    worker = _batch_lane_worker(redis_url, on_shutdown)
    main = asyncio.create_task(worker.main())
    await asyncio.sleep(0.2)
    # A job task cancelled before a handler of its own runs (as one just claimed is): it ends
    # in CancelledError, which arq's close gathered and re-raised, cutting the shutdown short.
    worker.tasks["just-claimed"] = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    main.cancel()
    await asyncio.gather(main, return_exceptions=True)
    await worker.close()
    assert shut_down == [True]


async def test_close_stops_the_wake_up_listener_with_the_pool(redis_url: str) -> None:
    async def nothing(ctx: dict[str, object]) -> None:
        pass

    worker = _batch_lane_worker(redis_url, nothing)
    main = asyncio.create_task(worker.main())
    await asyncio.sleep(0.2)
    background = list(worker._background)  # the wake-up listener
    assert background
    # As the runtime closes its batch lane: its main task ends, then its pool is closed.
    main.cancel()
    await asyncio.gather(main, return_exceptions=True)
    await worker.close()
    await asyncio.sleep(0.2)
    # Left running, the listener resubscribed on the dropped pool and died of an AttributeError.
    assert all(task.cancelled() for task in background)


def _batch_lane_worker(
    redis_url: str, on_shutdown: Callable[[dict[str, object]], Awaitable[None]]
) -> QueueWorker:
    async def unused(ctx: dict[str, object]) -> None:
        pass

    return QueueWorker(
        functions=[func(unused, name="unused")],
        queue_name="tf:test:close",
        redis_settings=jobqueue.redis_settings(redis_url),
        on_shutdown=on_shutdown,
        wake_channel="tf:test:close:wake",
        lane=keys.Lane.BATCH,
        drain_grace_s=1.0,
        drain_on_signals=False,
    )


async def test_a_poll_sets_keys_only_for_the_jobs_it_claims(redis: Redis) -> None:
    # 300 jobs running elsewhere hold the head of the queue; 5 free ones wait behind them.
    queue = keys.queue(FAKE_MODEL)
    for index in range(300):
        await redis.zadd(queue, {f"elsewhere-{index}": 1 + index})
        await redis.set(in_progress_key_prefix + f"elsewhere-{index}", b"1", px=60_000)
    await redis.zadd(queue, {f"free-{index}": 1_000 + index for index in range(5)})
    sets_before = await _calls(redis, "set")
    first = await claim_due_jobs(redis, queue, 2, 60.0, READ_WINDOW)
    second = await claim_due_jobs(redis, queue, 10, 60.0, READ_WINDOW)
    # Room for 2 claims the 2 oldest free jobs; the next poll claims the rest, never the same.
    assert first == [("free-0", 1_000), ("free-1", 1_001)]
    assert second == [(f"free-{index}", 1_000 + index) for index in range(2, 5)]
    # One SET per claimed job, none for the 300 running ones (MGET reads their keys).
    assert await _calls(redis, "set") - sets_before == 5
    assert await claim_due_jobs(redis, queue, 10, 60.0, READ_WINDOW) == []
