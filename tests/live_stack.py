"""A real gateway and a fake-engine worker as separate processes on loopback, for client-library tests.

Official clients (openai, huggingface_hub) and schemathesis speak real HTTP, so
they get real processes, like a deployment, rather than an in-process transport.
Each stack serves its own model name, so other tests' workers on the session's
Redis never take its jobs. Output goes to a log file, not a pipe: nobody reads a
pipe while the stack runs, and a full one would block the process that writes it.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from shared.redis_server import free_port
from shared.supervisor import Child
from tests.processes import serving, spawn_cli

START_TIMEOUT_S = 60.0


def _spawn(log: IO[bytes], *argv: str) -> Child:
    return spawn_cli(*argv, "--log-level", "WARNING", output=log)


@contextlib.contextmanager
def served_stack(redis_url: str, model: str, *, max_model_len: int = 256) -> Iterator[str]:
    """Start ``tokenferry worker --engine fake`` and ``tokenferry gateway``; yield the gateway's base URL.

    A small context window keeps generated answers (and fuzzed max_tokens) short.
    """
    port = free_port()
    with tempfile.TemporaryDirectory() as directory, open(Path(directory) / "stack.log", "w+b") as log:
        processes = [
            _spawn(
                log, "worker", "--redis-url", redis_url, "--engine", "fake", "--model", model,
                "--max-model-len", str(max_model_len), "--poll-delay", "0.01",
            ),
            _spawn(log, "gateway", "--redis-url", redis_url, "--port", str(port)),
        ]  # fmt: skip
        try:
            with serving(f"http://127.0.0.1:{port}", processes, model, START_TIMEOUT_S) as base_url:
                yield base_url
        except BaseException:
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-5000:])
            raise
