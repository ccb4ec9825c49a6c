"""Small builders shared by tests: an in-process stack and SSE parsing; no logic worth testing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any

import httpx
from arq.connections import ArqRedis
from arq.worker import Worker, func
from redis.asyncio import Redis

from gateway.http.app import create_app
from shared import keys
from shared.codec import deserialize_arq_job, serialize_arq_job
from shared.jobs import jobqueue
from shared.jobs.streams import EventReader
from shared.protocol import TokenEvent
from shared.settings import GatewaySettings, WorkerSettings
from worker.driver.engine_driver import DEFAULT_TUNING, DriverTuning
from worker.main import build_worker

FAKE_MODEL = "fake-model"


@contextlib.asynccontextmanager
async def running_stack(
    redis_url: str,
    *,
    gateway: Mapping[str, Any] | None = None,
    tuning: DriverTuning = DEFAULT_TUNING,
    **worker_overrides: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    """A real arq worker with the fake engine and the real gateway app, both in this event loop.

    ``gateway`` overrides gateway settings; with static keys there, the start-up probe uses the first.
    ``tuning`` moves the worker's step-loop trade-offs; other keywords override worker settings.
    """
    worker_settings = WorkerSettings(
        redis_url=redis_url, engine="fake", model=FAKE_MODEL, poll_delay_s=0.01, **worker_overrides
    )
    worker = build_worker(worker_settings, handle_signals=False, tuning=tuning)
    worker_task = asyncio.create_task(worker.async_run())
    gateway_settings = GatewaySettings(**{"redis_url": redis_url, "request_timeout_s": 30, **(gateway or {})})
    probe_key = next(iter(gateway_settings.admin_api_keys + gateway_settings.api_keys), None)
    app = create_app(gateway_settings)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://testserver", timeout=30
            ) as client:
                await wait_for_model(client, worker_settings.model_name, key=probe_key)
                yield client
    finally:
        # Let jobs whose answers were already read finish their arq bookkeeping first.
        running = [task for task in worker.tasks.values() if not task.done()]
        if running:
            await asyncio.wait(running, timeout=5)
        worker_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker_task
        await worker.close()


async def wait_for_model(
    client: httpx.AsyncClient, model: str, timeout_s: float = 30.0, key: str | None = None
) -> None:
    headers = {"authorization": f"Bearer {key}"} if key else None
    async with asyncio.timeout(timeout_s):
        while True:
            response = await client.get("/v1/models", headers=headers)
            if response.status_code == 200 and any(entry["id"] == model for entry in response.json()["data"]):
                return
            await asyncio.sleep(0.05)


def parse_sse(body: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded, with the final "[DONE]" kept as a string."""
    payloads: list[Any] = []
    for line in body.splitlines():
        if line.startswith("data:"):
            data = line.removeprefix("data:").strip()
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def chat_body(content: str = "Hi", **extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "messages": [{"role": "user", "content": content}], **extra}


async def until_running(redis: Redis, count: int, model: str = FAKE_MODEL) -> None:
    """Wait until workers have claimed ``count`` jobs of ``model`` (its running set)."""
    async with asyncio.timeout(10):
        while True:
            if int(await redis.scard(keys.running(model))) >= count:  # type: ignore[misc]
                return
            await asyncio.sleep(0.01)


async def all_events(redis: Redis, request_id: str, timeout_s: float = 60) -> list[TokenEvent]:
    """Every event of ``request_id`` through its terminal one."""
    reader = EventReader(redis)
    return [item.event async for item in reader.read(request_id, deadline=time.monotonic() + timeout_s)]


def bearer(secret: str) -> dict[str, str]:
    """The Authorization header of an API key."""
    return {"authorization": f"Bearer {secret}"}


@contextlib.asynccontextmanager
async def gateway_only(redis_url: str, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The real app and lifespan, no worker; httpx's ASGI transport pulls the body only when the app reads."""
    app = create_app(GatewaySettings(redis_url=redis_url, auth_cache_s=0, **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30) as client:
            yield client


@contextlib.asynccontextmanager
async def arq_stand_in(pool: ArqRedis, generate: Any, model: str, **options: Any) -> AsyncIterator[None]:
    """A bare arq worker running ``generate`` as the generate job of ``model``'s queue; closes ``pool``."""
    worker = Worker(
        functions=[func(generate, name=jobqueue.GENERATE_FUNCTION)],
        queue_name=keys.queue(model),
        redis_pool=pool,
        poll_delay=0.01,
        handle_signals=False,
        keep_result=0,
        job_serializer=serialize_arq_job,
        job_deserializer=deserialize_arq_job,
        **options,
    )
    try:
        async with in_background(worker.async_run()):
            yield
    finally:
        if worker.tasks:  # let finished or aborted jobs record their end; close() would cancel them mid-way
            await asyncio.wait(worker.tasks.values(), timeout=2)
        await worker.close()


@contextlib.asynccontextmanager
async def in_background(work: Coroutine[Any, Any, None]) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``work`` as a task for the block's length; then cancel it and wait until it has ended."""
    task = asyncio.create_task(work)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """Poll an outside condition (a server's teardown, an expiry) until it holds, with a deadline."""
    async with asyncio.timeout(timeout_s):
        while True:
            if await condition():
                return
            await asyncio.sleep(0.02)
