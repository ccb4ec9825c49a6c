"""Real gateway, worker and serve processes (fake engine) on loopback: what only real sockets show."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator

import httpx
import psutil
import pytest
from redis.asyncio import Redis

from shared import keys
from shared.redis_server import free_port
from tests.helpers import FAKE_MODEL, chat_body
from tests.processes import read_until_serving, serving, spawn_cli

START_TIMEOUT_S = 60.0


@pytest.fixture
def slow_stack(redis_url: str, redis: Redis) -> Iterator[str]:
    """A gateway and a fake-engine worker whose steps take 20 ms, as separate processes."""
    port = free_port()
    processes = [
        spawn_cli("worker", "--redis-url", redis_url, "--engine", "fake", "--model", FAKE_MODEL),
        spawn_cli("gateway", "--redis-url", redis_url, "--port", str(port)),
    ]
    with serving(f"http://127.0.0.1:{port}", processes, FAKE_MODEL, START_TIMEOUT_S) as base_url:
        yield base_url


@pytest.fixture(autouse=True)
def _slow_fake_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENFERRY_FAKE_STEP_DELAY_S", "0.02")


async def test_client_disconnect_aborts_generation(slow_stack: str, redis: Redis) -> None:
    body = chat_body(stream=True, ignore_eos=True, max_tokens=3000)
    async with httpx.AsyncClient(base_url=slow_stack, timeout=30) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            async for line in response.aiter_lines():
                if '"content":"T' in line:
                    break
    stream = keys.events(request_id)
    # The abort travels gateway -> Redis -> worker poll -> engine; wait until the stream stops growing.
    async with asyncio.timeout(20):
        previous, current = -1, await redis.xlen(stream)
        while current != previous:
            await asyncio.sleep(1.0)
            previous, current = current, await redis.xlen(stream)
    # 3000 tokens at 20 ms a step would take a minute; the job stopped long before.
    assert current < 500, "the worker kept generating for a departed client"


async def test_every_response_carries_a_request_id(slow_stack: str) -> None:
    async with httpx.AsyncClient(base_url=slow_stack, timeout=30) as client:
        ok = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2))
        bad = await client.post("/v1/chat/completions", json={"model": FAKE_MODEL})
        missing = await client.get("/nope")
    assert [r.status_code for r in (ok, bad, missing)] == [200, 400, 404]
    assert all(r.headers.get("x-request-id") for r in (ok, bad, missing))


def test_serve_puts_its_relays_under_sched_batch_when_the_worker_s_does() -> None:
    port = free_port()
    serve = spawn_cli(
        "serve", "--port", str(port), "--engine", "fake", "--model", FAKE_MODEL, "--os-scheduling", "batch"
    )
    try:
        read_until_serving(serve)
        children = psutil.Process(serve.pid).children(recursive=True)
        roles = {_role(child): child for child in children}
        assert {"gateway", "worker", "redis"} <= set(roles)
        for child in roles.values():
            assert {os.sched_getscheduler(thread.id) for thread in child.threads()} == {os.SCHED_BATCH}
        assert os.sched_getscheduler(serve.pid) == os.SCHED_OTHER  # serve itself only supervises
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=30)


def _role(process: psutil.Process) -> str:
    argv = process.cmdline()
    if "cli" in argv:
        return argv[argv.index("cli") + 1]  # gateway or worker
    return "redis" if "redis" in process.name() or "valkey" in process.name() else process.name()


def test_serve_starts_everything_and_ctrl_c_stops_everything() -> None:
    port = free_port()
    serve = spawn_cli("serve", "--port", str(port), "--engine", "fake", "--model", FAKE_MODEL)
    base_url = f"http://127.0.0.1:{port}"
    try:
        output = read_until_serving(serve)
        reply = httpx.post(f"{base_url}/v1/chat/completions", json=chat_body(max_tokens=3), timeout=30)
        assert reply.json()["choices"][0]["message"]["content"] == "The"
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=30)
        # read(), not communicate(): readline() above may hold buffered output communicate() skips.
        output += serve.stdout.read().decode() if serve.stdout else ""
    assert serve.returncode == 0, output
    assert (
        f"http://127.0.0.1:{port}/v1" in output and "curl" in output and "from openai import OpenAI" in output
    )
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base_url}/health", timeout=2)
    children = subprocess.run(
        ["pgrep", "-f", f"--port {port}"], capture_output=True, text=True
    ).stdout.split()
    assert children == [], "a child of serve outlived it"
    redis_port = re.search(r"redis://127\.0\.0\.1:(\d+)", output)
    assert redis_port is not None, output
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(redis_port.group(1))), timeout=2)
