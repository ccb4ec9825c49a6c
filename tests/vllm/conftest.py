"""Real processes on vLLM's engine: a gateway and two ``--engine vllm`` workers of the bundled model,
``a`` with vLLM's engine core in its own process (``--no-vllm-multiprocessing``, the default on
CPU), ``b`` with it in a child (``--vllm-multiprocessing``).

Run by ``make test-vllm`` only (``.venv-vllm``); ``make test`` never collects this folder
(``tests/conftest.py``). One cluster for the whole folder: a vLLM start costs a minute or
two on 2 cores, so the two workers start together once, and the takeover test, which
kills one of them, runs last.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from shared.redis_server import EmbeddedRedis, free_port
from shared.supervisor import Child
from tests.processes import serving, spawn_cli

MODEL = "smollm2-on-vllm"
READY_TIMEOUT_S = 900.0  # two vLLM starts at once on 2 cores, compiling on a fresh machine
WORKERS = ("a", "b")
# The worker whose engine core runs in a child process; the other's runs in the worker.
CHILD_CORE_WORKER = "b"


@dataclass
class VllmCluster:
    url: str
    redis_url: str
    workers: dict[str, Child]
    logs: Path

    def worker_id(self, name: str) -> str:
        return f"{MODEL}-{name}"


@pytest.fixture(scope="session")
def vllm_cluster() -> Iterator[VllmCluster]:
    with EmbeddedRedis() as redis:
        logs = Path(tempfile.mkdtemp(prefix="tokenferry-vllm-"))
        workers = {
            name: spawn_cli(
                "worker",
                "--engine",
                "vllm",
                "--redis-url",
                redis.url,
                "--served-model-name",
                MODEL,
                "--worker-id",
                f"{MODEL}-{name}",
                "--cpu-kvcache-space",
                "1",
                "--max-num-seqs",
                "16",
                "--vllm-multiprocessing" if name == CHILD_CORE_WORKER else "--no-vllm-multiprocessing",
                output=logs / f"worker-{name}.log",
            )
            for name in WORKERS
        }
        port = free_port()
        gateway = spawn_cli(
            "gateway", "--redis-url", redis.url, "--port", str(port), output=logs / "gateway.log"
        )
        processes = [*workers.values(), gateway]
        with serving(f"http://127.0.0.1:{port}", processes, MODEL, READY_TIMEOUT_S) as url:
            yield VllmCluster(url, redis.url, workers, logs)


@pytest.fixture
def client(vllm_cluster: VllmCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{vllm_cluster.url}/v1", api_key="unused", timeout=300, max_retries=0)
