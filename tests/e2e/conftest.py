"""Real processes with the real bundled model: a worker and a gateway on the session's Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from shared.redis_server import EmbeddedRedis, free_port
from shared.settings import BUNDLED_MODEL

READY_TIMEOUT_S = 600.0  # a fresh machine converts the bundled GGUF first (~35 s on 2 cores)


def _spawn(role: str, *argv: str, log_path: str) -> subprocess.Popen[bytes]:
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "shared.cli", role, *argv], stdout=log, stderr=log, env=env
    )


@pytest.fixture(scope="session")
def gateway_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    port = free_port()
    logs = tempfile.mkdtemp(prefix="tokenferry-e2e-")
    processes = [
        _spawn("worker", "--redis-url", redis_server.url, log_path=f"{logs}/worker.log"),
        _spawn(
            "gateway", "--redis-url", redis_server.url, "--port", str(port), log_path=f"{logs}/gateway.log"
        ),
    ]
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base_url, processes, logs)
        yield base_url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_ready(base_url: str, processes: list[subprocess.Popen[bytes]], logs: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(process.poll() is not None for process in processes):
            raise AssertionError(f"a process exited during start-up; logs in {logs}")
        try:
            if httpx.get(f"{base_url}/v1/models", timeout=5).json()["data"]:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"not ready after {READY_TIMEOUT_S} s; logs in {logs}")


@pytest.fixture
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", timeout=300, max_retries=0)


@pytest.fixture
def model() -> str:
    return BUNDLED_MODEL
