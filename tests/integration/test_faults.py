"""Faults with real processes (fake engine, real Redis, loopback): kills, drains, overload, outages.

Each test serves its own model name, so the reapers and queues of other tests'
workers on the session's Redis never touch its requests.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from redis.asyncio import Redis

from shared import keys
from shared.redis_server import EmbeddedRedis, free_port
from shared.supervisor import Child
from tests.processes import StreamReader, chat_text, parse_sse, spawn_cli, stop_all, wait_for_model

START_TIMEOUT_S = 60.0
# Slow enough to kill a process mid-stream, fast enough to keep the tests short.
STEP_DELAY_S = "0.03"
LONG = 240  # tokens of a long stream: ~7 s at STEP_DELAY_S


@dataclass
class Cluster:
    redis_url: str
    model: str = field(default_factory=lambda: f"fault-{uuid.uuid4().hex[:8]}")
    gateways: dict[str, tuple[Child, str]] = field(default_factory=dict)
    workers: dict[str, Child] = field(default_factory=dict)

    def add_gateway(self, name: str, *flags: str) -> str:
        port = free_port()
        process = spawn_cli("gateway", "--redis-url", self.redis_url, "--port", str(port), *flags)
        url = f"http://127.0.0.1:{port}"
        self.gateways[name] = (process, url)
        return url

    def add_worker(self, name: str, *flags: str, env: dict[str, str] | None = None) -> None:
        worker_id = f"{self.model}-{name}"
        self.workers[name] = spawn_cli(
            "worker", "--redis-url", self.redis_url, "--engine", "fake", "--model", self.model,
            "--worker-id", worker_id, *flags,
            env={"TOKENFERRY_FAKE_STEP_DELAY_S": STEP_DELAY_S, **(env or {})},
        )  # fmt: skip

    def url(self, name: str) -> str:
        return self.gateways[name][1]

    def wait_ready(self) -> None:
        processes = [*self.workers.values(), *(process for process, _ in self.gateways.values())]
        for _, url in self.gateways.values():
            wait_for_model(url, processes, self.model, START_TIMEOUT_S)

    def worker_name(self, worker_id: str) -> str:
        return worker_id.removeprefix(f"{self.model}-")

    def body(self, max_tokens: int = LONG, **extra: object) -> dict[str, object]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            **extra,
        }

    def stop(self) -> None:
        stop_all([*self.workers.values(), *(process for process, _ in self.gateways.values())])


@pytest.fixture
def cluster(redis_url: str, redis: Redis) -> Iterator[Cluster]:
    built = Cluster(redis_url)
    try:
        yield built
    finally:
        built.stop()


async def _uninterrupted_text(url: str, body: dict[str, object]) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        response = await client.post("/v1/chat/completions", json={**body, "stream": False})
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])


async def _owner(redis: Redis, request_id: str) -> str:
    owner = await redis.hget(keys.run(request_id), "owner")  # type: ignore[misc]
    assert owner, "the request has no owner while it streams"
    return owner.decode().rpartition("/")[0]


@pytest.mark.timeout(180)
async def test_a_killed_worker_s_stream_resumes_on_another_with_the_exact_text(
    cluster: Cluster, redis: Redis
) -> None:
    url = cluster.add_gateway("g")
    cluster.add_worker("a")
    cluster.add_worker("b")
    cluster.wait_ready()
    body = cluster.body()
    expected = await _uninterrupted_text(url, body)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            stream = StreamReader(response)
            await stream.until_text(20)
            victim = cluster.worker_name(await _owner(redis, response.headers["x-request-id"]))
            cluster.workers[victim].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            await stream.rest()
    recovered_in = time.monotonic() - killed_at
    events = stream.events
    assert events[-1].data == "[DONE]"
    assert chat_text(events) == expected  # nothing lost, nothing repeated
    assert events[-2].json()["choices"][0]["finish_reason"] == "length"
    assert recovered_in < 60


@pytest.mark.timeout(180)
async def test_a_client_resumes_on_another_gateway_with_last_event_id(cluster: Cluster) -> None:
    first = cluster.add_gateway("first")
    second = cluster.add_gateway("second")
    cluster.add_worker("w")
    cluster.wait_ready()
    body = cluster.body()
    expected = await _uninterrupted_text(second, body)
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{first}/v1/chat/completions", json=body) as response:
            request_id = response.headers["x-request-id"]
            stream = StreamReader(response)
            await stream.until_text(20)
            cluster.gateways["first"][0].send_signal(signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):
                await stream.rest()
        received = [event for event in stream.events if event.id is not None]
        last_id = received[-1].id
        assert last_id is not None
        # Keep only what the client can trust: events up to the last id it saw.
        kept = stream.events[: stream.events.index(received[-1]) + 1]
        resumed = await client.get(
            f"{second}/v1/requests/{request_id}/stream", headers={"Last-Event-ID": last_id}
        )
    assert resumed.status_code == 200
    rest = parse_sse(resumed.text.splitlines())
    assert rest[-1].data == "[DONE]"
    assert chat_text(kept) + chat_text(rest) == expected


async def test_resuming_another_tenant_s_or_an_unknown_stream_is_404(cluster: Cluster) -> None:
    url = cluster.add_gateway("g")
    cluster.add_worker("w")
    cluster.wait_ready()
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        response = await client.get(f"/v1/requests/{uuid.uuid4().hex}/stream")
        assert response.status_code == 404
        assert response.json()["error"]["param"] == "request_id"
        done = await client.post("/v1/chat/completions", json=cluster.body(max_tokens=5))
        request_id = done.headers["x-request-id"]
        bad = await client.get(f"/v1/requests/{request_id}/stream", headers={"Last-Event-ID": "1-0"})
        assert bad.status_code == 400
        whole = await client.get(f"/v1/requests/{request_id}/stream")
        assert whole.status_code == 200
        assert parse_sse(whole.text.splitlines())[-1].data == "[DONE]"


@pytest.mark.timeout(180)
async def test_sigterm_drains_a_worker_finishing_its_streams(cluster: Cluster, redis: Redis) -> None:
    url = cluster.add_gateway("g")
    cluster.add_worker("w", "--drain-grace", "60")
    cluster.wait_ready()
    body = cluster.body(max_tokens=100)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            stream = StreamReader(response)
            await stream.until_text(10)
            cluster.workers["w"].send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            refused = await client.post("/v1/chat/completions", json=cluster.body(max_tokens=5))
            await stream.rest()
    assert refused.status_code == 503  # a draining worker takes no new work
    assert stream.events[-1].data == "[DONE]"
    assert len(chat_text(stream.events).encode()) == 100
    assert cluster.workers["w"].wait(timeout=30) == 0
    assert not await redis.exists(keys.worker(f"{cluster.model}-w"))


@pytest.mark.timeout(180)
async def test_a_drain_whose_grace_runs_out_hands_its_streams_over(cluster: Cluster, redis: Redis) -> None:
    url = cluster.add_gateway("g")
    cluster.add_worker("a", "--drain-grace", "1")
    cluster.wait_ready()
    body = cluster.body()
    expected = await _uninterrupted_text(url, body)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            stream = StreamReader(response)
            await stream.until_text(10)
            cluster.add_worker("b")
            cluster.workers["a"].send_signal(signal.SIGTERM)
            await stream.rest()
    assert chat_text(stream.events) == expected
    assert cluster.workers["a"].wait(timeout=30) == 0


@pytest.mark.timeout(120)
async def test_sigterm_lets_a_gateway_finish_its_open_streams(cluster: Cluster) -> None:
    url = cluster.add_gateway("g")
    cluster.add_worker("w")
    cluster.wait_ready()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        body = cluster.body(max_tokens=80)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            stream = StreamReader(response)
            await stream.until_text(5)
            cluster.gateways["g"][0].send_signal(signal.SIGTERM)
            await stream.rest()
    assert stream.events[-1].data == "[DONE]"
    assert len(chat_text(stream.events).encode()) == 80
    # uvicorn re-raises the signal once its graceful shutdown is done
    assert cluster.gateways["g"][0].wait(timeout=30) in (0, -signal.SIGTERM)


@pytest.mark.timeout(120)
async def test_overload_is_answered_with_429_and_retry_after_never_5xx(cluster: Cluster) -> None:
    url = cluster.add_gateway("g", "--max-queued-requests", "2")
    cluster.add_worker("w", "--max-batch-size", "2")
    cluster.wait_ready()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        bodies = [cluster.body(max_tokens=30, stream=False) for _ in range(12)]
        responses = await asyncio.gather(*(client.post("/v1/chat/completions", json=b) for b in bodies))
    statuses = sorted(response.status_code for response in responses)
    assert set(statuses) <= {200, 429}, statuses
    assert 429 in statuses and 200 in statuses
    refused = next(response for response in responses if response.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"


@pytest.mark.timeout(120)
async def test_a_request_that_cannot_start_before_its_deadline_gets_a_clear_error(cluster: Cluster) -> None:
    patient = cluster.add_gateway("patient")
    hurried = cluster.add_gateway("hurried", "--request-timeout", "3")
    cluster.add_worker("w", "--max-batch-size", "1")
    cluster.wait_ready()
    async with httpx.AsyncClient(timeout=60) as client:
        busy = asyncio.ensure_future(
            client.post(f"{patient}/v1/chat/completions", json=cluster.body(max_tokens=300, stream=False))
        )
        await asyncio.sleep(0.5)
        started = time.monotonic()
        waiting = await client.post(
            f"{hurried}/v1/chat/completions", json=cluster.body(max_tokens=5, stream=False)
        )
        waited = time.monotonic() - started
        assert (await busy).status_code == 200
    assert waiting.status_code == 504
    assert waiting.json()["error"]["code"] == "timeout"
    assert waited < 15


@pytest.mark.timeout(180)
async def test_redis_outage_answers_503_at_once_and_service_resumes_by_itself() -> None:
    with EmbeddedRedis(append_only=True) as server:
        built = Cluster(server.url)
        try:
            url = built.add_gateway("g")
            built.add_worker("w")
            built.wait_ready()
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                server._stop_process()
                started = time.monotonic()
                down = await client.post("/v1/chat/completions", json=built.body(max_tokens=5, stream=False))
                assert down.status_code == 503
                assert time.monotonic() - started < 5
                assert (await client.get("/ready")).status_code == 503
                server.start()
                deadline = time.monotonic() + 30
                while True:
                    again = await client.post(
                        "/v1/chat/completions", json=built.body(max_tokens=5, stream=False)
                    )
                    if again.status_code == 200 or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
            assert again.status_code == 200, again.text
            assert all(process.poll() is None for process in built.workers.values())
        finally:
            built.stop()


@pytest.mark.timeout(180)
async def test_a_stream_rides_out_a_redis_restart(cluster: Cluster) -> None:
    with EmbeddedRedis(append_only=True) as server:
        built = Cluster(server.url)
        try:
            url = built.add_gateway("g")
            built.add_worker("w")
            built.wait_ready()
            body = built.body(max_tokens=150)
            expected = await _uninterrupted_text(url, body)
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    stream = StreamReader(response)
                    await stream.until_text(10)
                    server.restart()
                    await stream.rest()
            assert stream.events[-1].data == "[DONE]"
            assert chat_text(stream.events) == expected
        finally:
            built.stop()


@pytest.mark.timeout(120)
async def test_workers_of_several_models_serve_only_their_own_and_models_list_what_is_live(
    cluster: Cluster, redis: Redis
) -> None:
    url = cluster.add_gateway("g")
    cluster.add_worker("a")
    other_model = f"{cluster.model}-other"
    other = spawn_cli(
        "worker", "--redis-url", cluster.redis_url, "--engine", "fake", "--model", other_model,
        "--worker-id", f"{other_model}-x", "--served-model-name", other_model,
    )  # fmt: skip
    cluster.workers["other"] = other
    cluster.wait_ready()
    wait_for_model(url, [other], other_model, START_TIMEOUT_S)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        listed = {entry["id"] for entry in (await client.get("/v1/models")).json()["data"]}
        assert {cluster.model, other_model} <= listed
        for model, worker_id in ((cluster.model, f"{cluster.model}-a"), (other_model, f"{other_model}-x")):
            body = {**cluster.body(max_tokens=40), "model": model}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                stream = StreamReader(response)
                await stream.until_text(3)
                assert await _owner(redis, response.headers["x-request-id"]) == worker_id
                await stream.rest()
            assert len(chat_text(stream.events).encode()) == 40
        other.send_signal(signal.SIGKILL)
        other.wait()
        deadline = time.monotonic() + 3 * keys.WORKER_TTL_S
        while other_model in {entry["id"] for entry in (await client.get("/v1/models")).json()["data"]}:
            assert time.monotonic() < deadline, "a dead worker's model stayed listed"
            await asyncio.sleep(0.25)
        body = {**cluster.body(stream=False), "model": other_model}
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 503
