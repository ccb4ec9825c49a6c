"""Real processes with the real bundled model: a worker and a gateway on a Redis of their own.

Their own Redis: the session lives on while the integration tests run, and a live
real-model worker on the shared Redis would answer those tests' requests too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from shared.redis_server import EmbeddedRedis, free_port
from shared.settings import BUNDLED_MODEL
from tests.processes import serving, spawn_cli

READY_TIMEOUT_S = 600.0  # a fresh machine converts the bundled GGUF first (~35 s on 2 cores)


@pytest.fixture(scope="session")
def e2e_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture(scope="session")
def gateway_url(e2e_redis: EmbeddedRedis) -> Iterator[str]:
    redis_url = e2e_redis.url
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="tokenferry-e2e-"))
    processes = [
        # float32: these tests assert exact greedy equalities across calls, batches, prefix-cache
        # hits and streams, which bf16 (``--dtype auto`` on CPUs that run it) does not keep: its
        # rounding makes a greedy answer depend on the path (docs/performance.md).
        spawn_cli("worker", "--redis-url", redis_url, "--dtype", "float32", output=logs / "worker.log"),
        spawn_cli("gateway", "--redis-url", redis_url, "--port", str(port), output=logs / "gateway.log"),
    ]
    with serving(f"http://127.0.0.1:{port}", processes, BUNDLED_MODEL, READY_TIMEOUT_S) as base_url:
        yield base_url


@pytest.fixture
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", timeout=300, max_retries=0)


@pytest.fixture
def model() -> str:
    return BUNDLED_MODEL
