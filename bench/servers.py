"""Owns the server processes under test: a private Redis, one worker and one gateway, always stopped.

They are the production entry points (``python -m cli worker|gateway``),
started as tests/e2e/conftest.py starts them. Each child gets its own session
(``start_new_session``) so a Ctrl-C reaches only the benchmark, which then stops
the gateway and worker (SIGTERM, SIGKILL after a grace period) and Redis, in
that order, from a ``finally``. Their logs go to a temporary directory whose
path is reported, and whose tails are printed if start-up fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from shared.redis_server import EmbeddedRedis, free_port

READY_TIMEOUT_S = 600.0  # a fresh machine converts the bundled GGUF first (~35 s on 2 cores)
STOP_GRACE_S = 20.0


class ServerStartError(RuntimeError):
    """A server process exited or did not become ready; the message names its log directory."""


@dataclass(frozen=True)
class RunningServers:
    base_url: str
    model: str
    logs_dir: Path
    worker_argv: tuple[str, ...]


def _spawn(role: str, argv: Sequence[str], logs_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(logs_dir / f"{role}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "cli", role, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _log_tails(logs_dir: Path, lines: int = 20) -> str:
    tails = []
    for log in sorted(logs_dir.glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        tails.append(f"--- {log.name} ---\n" + "\n".join(text))
    return "\n".join(tails)


def _wait_ready(base_url: str, processes: Sequence[subprocess.Popen[bytes]], logs_dir: Path) -> str:
    """Block until the gateway lists a model; return its id."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(process.poll() is not None for process in processes):
            raise ServerStartError(f"a server process exited during start-up\n{_log_tails(logs_dir)}")
        try:
            models = httpx.get(f"{base_url}/v1/models", timeout=5).json()["data"]
            if models:
                return str(models[0]["id"])
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise ServerStartError(f"not ready after {READY_TIMEOUT_S:.0f} s\n{_log_tails(logs_dir)}")


@contextmanager
def running_servers(worker_args: Sequence[str]) -> Iterator[RunningServers]:
    """Redis, a worker with ``worker_args`` and a gateway; stopped on exit, whatever the exit."""
    logs_dir = Path(tempfile.mkdtemp(prefix="tokenferry-bench-"))
    redis = EmbeddedRedis()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        redis.start()
        port = free_port()
        worker_argv = ("--redis-url", redis.url, *worker_args)
        processes.append(_spawn("worker", worker_argv, logs_dir))
        processes.append(_spawn("gateway", ["--redis-url", redis.url, "--port", str(port)], logs_dir))
        base_url = f"http://127.0.0.1:{port}"
        model = _wait_ready(base_url, processes, logs_dir)
        yield RunningServers(base_url, model, logs_dir, tuple(worker_args))
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan them
        try:
            _stop(list(reversed(processes)))  # the gateway first, so no new job reaches the worker
            redis.stop()
        finally:
            signal.signal(signal.SIGINT, previous)
