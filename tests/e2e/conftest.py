"""Real processes with the real bundled model: a worker and a gateway on a Redis of their own.

Their own Redis: the session lives on while the integration tests run, and a live
real-model worker on the shared Redis would answer those tests' requests too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import openai
import pytest

from shared.redis_server import EmbeddedRedis, free_port
from shared.settings import BUNDLED_MODEL
from tests.processes import stop_all, wait_for_model

READY_TIMEOUT_S = 600.0  # a fresh machine converts the bundled GGUF first (~35 s on 2 cores)


def _spawn(role: str, *argv: str, log_path: str) -> subprocess.Popen[bytes]:
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "cli", role, *argv], stdout=log, stderr=log, env=env
    )


@pytest.fixture(scope="session")
def e2e_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture(scope="session")
def gateway_url(e2e_redis: EmbeddedRedis) -> Iterator[str]:
    redis_server = e2e_redis
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
        wait_for_model(base_url, processes, BUNDLED_MODEL, READY_TIMEOUT_S)
        yield base_url
    finally:
        stop_all(processes)


@pytest.fixture
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", timeout=300, max_retries=0)


@pytest.fixture
def model() -> str:
    return BUNDLED_MODEL
