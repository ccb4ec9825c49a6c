"""Failover with the real SmolLM2-135M-Instruct: a SIGKILLed worker's greedy stream ends elsewhere, exactly.

The workers serve the bundled model under a name of this test's own, so the
session's other e2e worker (same Redis) neither takes the job nor reaps it.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from redis.asyncio import Redis

from shared import keys
from shared.redis_server import free_port
from shared.supervisor import Child
from tests.processes import StreamReader, chat_text, spawn_cli, stop_all, wait_for_model

# Generous: the real model on 2 busy cores, loaded by two workers.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

READY_TIMEOUT_S = 600.0  # a fresh machine converts the bundled GGUF first
MAX_TOKENS = 48
KILL_AFTER_CHARS = 15


class Cluster:
    """One gateway and named workers of the real model, served under a private name."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.model = f"failover-{uuid.uuid4().hex[:8]}"
        self.gateway: Child | None = None
        self.url = ""
        self.workers: dict[str, Child] = {}

    def start(self, *worker_names: str) -> None:
        for name in worker_names:
            self.workers[name] = spawn_cli(
                "worker", "--redis-url", self.redis_url, "--served-model-name", self.model,
                "--worker-id", self.worker_id(name), "--torch-threads", "1",
                "--dtype", "float32",  # the exact-text resume needs fp32 (tests/e2e/conftest.py)
            )  # fmt: skip
        port = free_port()
        self.gateway = spawn_cli("gateway", "--redis-url", self.redis_url, "--port", str(port))
        self.url = f"http://127.0.0.1:{port}"
        wait_for_model(self.url, self.processes, self.model, READY_TIMEOUT_S)

    def worker_id(self, name: str) -> str:
        return f"{self.model}-{name}"

    def worker_name(self, worker_id: str) -> str:
        return worker_id.removeprefix(f"{self.model}-")

    @property
    def processes(self) -> list[Child]:
        return [*self.workers.values(), *([self.gateway] if self.gateway else [])]

    def stop(self) -> None:
        stop_all(self.processes)

    def output(self) -> str:
        """Every process's output (they must have ended): pytest shows it when the test fails."""
        named = [*self.workers.items(), *([("gateway", self.gateway)] if self.gateway else [])]
        parts = []
        for name, process in named:
            text = process.stdout.read().decode(errors="replace") if process.stdout else ""
            parts.append(f"===== {name} (exit {process.returncode}) =====\n{text[-20_000:]}")
        return "\n".join(parts)


@pytest.fixture
def cluster(redis_url: str) -> Iterator[Cluster]:
    built = Cluster(redis_url)
    try:
        yield built
    finally:
        built.stop()
        print(built.output())


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A client that leaves the database alone: the session's e2e worker shares it."""
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def _owner(redis: Redis, request_id: str) -> str | None:
    owner = await redis.hget(keys.run(request_id), "owner")  # type: ignore[misc]
    return owner.decode() if owner else None


async def _watch_owners(redis: Redis, request_id: str, seen: list[str]) -> None:
    """Record every distinct owner of the request's run record until cancelled."""
    while True:
        owner = await _owner(redis, request_id)
        if owner and (not seen or seen[-1] != owner):
            seen.append(owner)
        await asyncio.sleep(0.02)


async def test_a_sigkilled_worker_s_greedy_stream_ends_on_another_with_the_exact_text(
    cluster: Cluster, redis: Redis
) -> None:
    cluster.start("a", "b")
    body = {
        "model": cluster.model,
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=cluster.url, timeout=300) as client:
        uninterrupted = await client.post("/v1/chat/completions", json=body)
        assert uninterrupted.status_code == 200, uninterrupted.text
        expected = uninterrupted.json()["choices"][0]["message"]["content"]
        assert uninterrupted.json()["usage"]["completion_tokens"] == MAX_TOKENS
        assert len(expected) > 2 * KILL_AFTER_CHARS

        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            stream = StreamReader(response)
            await stream.until_text(KILL_AFTER_CHARS)
            first_owner = await _owner(redis, request_id)
            assert first_owner and first_owner.endswith("/0"), first_owner
            victim = cluster.worker_name(first_owner.rpartition("/")[0])
            cluster.workers[victim].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            owners: list[str] = [first_owner]
            watcher = asyncio.create_task(_watch_owners(redis, request_id, owners))
            try:
                await stream.rest()
            finally:
                watcher.cancel()
    recovered_in = time.monotonic() - killed_at

    survivor = next(name for name in cluster.workers if name != victim)
    assert cluster.workers[victim].wait(timeout=10) == -signal.SIGKILL
    assert cluster.workers[survivor].poll() is None
    # The stream outlived its first owner: the other worker took it over as attempt 1.
    assert f"{cluster.worker_id(survivor)}/1" in owners, owners
    events = stream.events
    assert events[-1].data == "[DONE]"
    assert chat_text(events) == expected  # nothing lost, nothing repeated, the same greedy tokens
    assert events[-2].json()["choices"][0]["finish_reason"] == "length"
    assert recovered_in < 120
