"""Owns the server processes under test: a private Redis, one worker and one gateway, always stopped.

They are the production entry points (``python -m cli worker|gateway``),
started as tests/e2e/conftest.py starts them. Each child leads its own process
group (``shared.supervisor``) so a Ctrl-C reaches only the benchmark, which then stops
the gateway and worker (SIGTERM, SIGKILL after a grace period) and Redis, in
that order, from a ``finally``. Their logs go to a temporary directory whose
path is reported, and whose tails are printed if start-up fails.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from shared.os_scheduling import batch_relays
from shared.redis_server import EmbeddedRedis, free_port
from shared.supervisor import (
    ChildExited,
    NotReady,
    Supervisor,
    ctrl_c_ignored,
    served_models,
)

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
    worker_pid: int | None = None


def log_tails(logs_dir: Path, lines: int = 20) -> str:
    tails = []
    for log in sorted(logs_dir.glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        tails.append(f"--- {log.name} ---\n" + "\n".join(text))
    return "\n".join(tails)


def _wait_ready(base_url: str, supervisor: Supervisor, logs_dir: Path) -> str:
    """Block until the gateway lists a model; return its id."""
    try:
        models = supervisor.wait_until(
            lambda: served_models(base_url, timeout_s=5), timeout_s=READY_TIMEOUT_S, what="the gateway"
        )
    except ChildExited:
        raise ServerStartError(f"a server process exited during start-up\n{log_tails(logs_dir)}") from None
    except NotReady:
        raise ServerStartError(f"not ready after {READY_TIMEOUT_S:.0f} s\n{log_tails(logs_dir)}") from None
    return models[0]


@contextmanager
def running_servers(
    worker_args: Sequence[str],
    *,
    python: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    relays_batch: bool = False,
) -> Iterator[RunningServers]:
    """Redis, a worker with ``worker_args`` and a gateway; stopped on exit, whatever the exit.

    ``python`` is the interpreter both run under (``python -m cli``, so started from the
    repository root the checkout's code is imported whatever venv it is): by default this one.
    ``extra_env`` is added to both processes' environment. ``relays_batch``: the gateway and
    Redis under SCHED_BATCH, as ``tokenferry serve`` starts them beside a ``--engine vllm`` worker.
    """
    logs_dir = Path(tempfile.mkdtemp(prefix="tokenferry-bench-"))
    redis = EmbeddedRedis()
    supervisor = Supervisor(grace_s=STOP_GRACE_S)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(extra_env or {})}
    cli = [python or sys.executable, "-m", "cli"]
    try:
        redis.start()
        port = free_port()
        # As ``tokenferry serve`` connects its children: over the private server's Unix socket.
        worker = [*cli, "worker", "--redis-url", redis.socket_url, *worker_args]
        worker_child = supervisor.start("worker", worker, env=env, output=logs_dir / "worker.log")
        gateway = [*cli, "gateway", "--redis-url", redis.socket_url, "--port", str(port)]
        gateway_child = supervisor.start("gateway", gateway, env=env, output=logs_dir / "gateway.log")
        base_url = f"http://127.0.0.1:{port}"
        model = _wait_ready(base_url, supervisor, logs_dir)
        if relays_batch:  # as ``tokenferry serve`` schedules them beside vLLM's engine core
            batch_relays(gateway_child.pid, redis.pid)
        yield RunningServers(base_url, model, logs_dir, tuple(worker_args), worker_child.pid)
    finally:
        with ctrl_c_ignored():  # a second Ctrl-C must not orphan them
            supervisor.stop()  # the gateway first, so no new job reaches the worker
            redis.stop()
