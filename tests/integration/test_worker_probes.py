"""The worker's /health and /ready on its HTTP port, as a kubelet sees them: loading, serving, draining.

A real worker (fake engine) on the session's Redis, its HTTP port on loopback. The
model's load is held behind an event, so the probes are read while it loads
instead of hoping to catch that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from redis.asyncio import Redis

from shared import registry
from shared.jobs import jobqueue
from shared.protocol import ChatMessage, ChatPrompt, GenerationJob, SamplingSpec
from shared.redis_server import free_port
from shared.settings import WorkerSettings
from tests.helpers import all_events, in_background, until_running
from worker import runtime
from worker.main import build_worker
from worker.model.backend import Backend, load_backend
from worker.queue.consumer import QueueWorker


async def _answer(probe: httpx.AsyncClient, path: str) -> httpx.Response:
    """The first answer on ``path``, once the worker has bound its port."""
    async with asyncio.timeout(30):
        while True:
            with contextlib.suppress(httpx.TransportError):
                return await probe.get(path)
            await asyncio.sleep(0.02)


async def _until_ready(probe: httpx.AsyncClient) -> httpx.Response:
    async with asyncio.timeout(30):
        while True:
            response = await probe.get("/ready")
            if response.status_code == 200:
                return response
            await asyncio.sleep(0.02)


async def _registered(redis: Redis, model: str) -> list[str]:
    return [info.worker_id for info in await registry.live_workers(redis) if info.model == model]


@contextlib.asynccontextmanager
async def _running(worker: QueueWorker) -> AsyncIterator[asyncio.Task[None]]:
    try:
        async with in_background(worker.async_run()) as task:
            yield task
    finally:
        await worker.close()


def _long_job(model: str) -> GenerationJob:
    return GenerationJob(
        request_id=f"probe-{uuid.uuid4().hex}",
        model=model,
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content="Hi")]),
        sampling=SamplingSpec(max_tokens=150, ignore_eos=True),
        created_at=time.time(),
    )


async def test_ready_only_between_registration_and_drain_alive_throughout(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = threading.Event()

    def held_load(
        settings: WorkerSettings, on_grammar_compile: Callable[[float], None] | None = None
    ) -> Backend:
        loaded.wait()
        return load_backend(settings, on_grammar_compile)

    monkeypatch.setattr(runtime, "load_backend", held_load)
    model, port = f"probes-{uuid.uuid4().hex[:8]}", free_port()
    settings = WorkerSettings(
        redis_url=redis_url, engine="fake", model=model, worker_id=f"{model}-w", poll_delay_s=0.01,
        metrics_port=port, fake_step_delay_s=0.01, drain_grace_s=60,
    )  # fmt: skip
    worker = build_worker(settings, handle_signals=False)
    async with _running(worker), httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as probe:
        loading = await _answer(probe, "/health")
        not_ready = await probe.get("/ready")
        registered_while_loading = await _registered(redis, model)
        loaded.set()

        ready = await _until_ready(probe)
        alive = await probe.get("/health")
        assert await _registered(redis, model) == [settings.worker_id]
        assert (await probe.get("/metrics")).status_code == 200  # the exposition still answers beside them

        pool = await jobqueue.open_pool(redis_url)
        try:
            job = _long_job(model)
            await jobqueue.enqueue(pool, job)
            await until_running(redis, 1, model)
            worker.drain()
            draining = await probe.get("/ready")
            alive_while_draining = await probe.get("/health")
            events = await all_events(pool, job.request_id)
        finally:
            await pool.aclose()

    assert (loading.status_code, not_ready.status_code) == (503, 503)
    assert "loading the model" in loading.json()["error"]["message"]
    assert "loading the model" in not_ready.json()["error"]["message"]
    assert not_ready.json()["error"]["type"] == "service_unavailable_error"
    assert registered_while_loading == []
    assert ready.json() == {"status": "ready", "worker_id": settings.worker_id}
    assert alive.json() == {"status": "ok"}
    assert draining.status_code == 503
    assert "draining" in draining.json()["error"]["message"]
    # Still alive while it drains: a liveness failure now would kill the streams it is finishing.
    assert alive_while_draining.status_code == 200
    assert events[-1].type == "finished"
