"""Observability of real processes: JSON logs that follow one request id from gateway to worker,
the worker's metrics port, and ``tokenferry status``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.redis_server import EmbeddedRedis, free_port
from tests.helpers import FAKE_MODEL, chat_body
from tests.processes import serving, spawn_cli
from tests.scrape import Scrape

START_TIMEOUT_S = 60.0
SECRET_PROMPT = "zebra-crossing-4417 is my password"


@dataclass(frozen=True)
class JsonStack:
    redis_url: str
    base_url: str
    metrics_url: str
    gateway_log: Path
    worker_log: Path


@pytest.fixture(scope="module")
def json_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JsonStack]:
    """One gateway and one fake-engine worker logging JSON, for the whole module (starting costs seconds).

    Its own Redis: `status` shows every worker it can see, and the session's Redis has others.
    """
    private_redis = EmbeddedRedis().start()
    redis_url = private_redis.url
    port, metrics_port = free_port(), free_port()
    logs = tmp_path_factory.mktemp("logs")
    stack = JsonStack(
        redis_url,
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{metrics_port}/metrics",
        logs / "gateway.log",
        logs / "worker.log",
    )
    worker_flags = ["--engine", "fake", "--model", FAKE_MODEL, "--metrics-port", str(metrics_port)]
    worker = ["worker", "--redis-url", redis_url, "--log-format", "json", *worker_flags]
    gateway = ["gateway", "--redis-url", redis_url, "--port", str(port), "--log-format", "json"]
    processes = [
        spawn_cli(*worker, output=stack.worker_log),
        spawn_cli(*gateway, output=stack.gateway_log),
    ]
    try:
        with serving(stack.base_url, processes, FAKE_MODEL, START_TIMEOUT_S):
            yield stack
    finally:
        private_redis.stop()


def _json_lines(log: Path) -> list[dict[str, Any]]:
    """Every line of ``log`` as JSON; a line that is not JSON fails the test."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


async def _lines_of(log: Path, request_id: str, until: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """``log``'s lines for ``request_id``, once one of them starts with ``until``."""
    async with asyncio.timeout(timeout_s):
        while True:
            lines = [line for line in _json_lines(log) if line["request_id"] == request_id]
            if any(line["message"].startswith(until) for line in lines):
                return lines
            await asyncio.sleep(0.1)


async def test_json_logs_carry_one_request_id_through_gateway_and_worker(json_stack: JsonStack) -> None:
    async with httpx.AsyncClient(base_url=json_stack.base_url, timeout=30) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(SECRET_PROMPT))
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    gateway = await _lines_of(json_stack.gateway_log, request_id, until="finished")
    worker = await _lines_of(json_stack.worker_log, request_id, until="finished")
    assert {line["process"] for line in gateway} == {"gateway"}
    assert {line["process"] for line in worker} == {"worker"}
    assert any(line["message"].startswith("accepted worker=") for line in gateway)
    assert any(line["message"].startswith("started on") for line in worker)
    assert set(gateway[0]) >= {"ts", "level", "logger", "message", "request_id", "process", "host", "pid"}
    # Prompts never reach the logs at INFO, in either process.
    for log in (json_stack.gateway_log, json_stack.worker_log):
        assert "zebra-crossing" not in log.read_text()


async def test_the_worker_serves_metrics_on_its_port(json_stack: JsonStack) -> None:
    async with httpx.AsyncClient(base_url=json_stack.base_url, timeout=30) as client:
        before = Scrape.parse((await client.get(json_stack.metrics_url)).text)
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
        assert response.status_code == 200
        after = Scrape.parse((await client.get(json_stack.metrics_url)).text)
    for name, increase in (("generation_tokens_total", 5), ("queue_wait_seconds_count", 1)):
        sample = f"tokenferry_worker_{name}"
        assert after.value(sample) - before.value(sample) == increase


def test_status_once_prints_the_live_worker_and_its_queues(json_stack: JsonStack) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "status", "--once", "--redis-url", json_stack.redis_url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2].startswith("WORKERS: 1 live")
    worker_row = lines[4].split()
    assert worker_row[1] == FAKE_MODEL and worker_row[3] == "ago"
    queue_rows = [line.split() for line in lines if line.split()[:1] == [FAKE_MODEL]]
    assert queue_rows == [[FAKE_MODEL, "interactive", "0"], [FAKE_MODEL, "batch", "0"]]


def test_status_once_fails_clearly_without_redis() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = subprocess.run(
        [sys.executable, "-m", "cli", "status", "--once", "--redis-url", url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"tokenferry status: cannot read Redis at {url}")
