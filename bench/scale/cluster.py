"""Owns the scale bench's processes: one Redis, gateways, fake workers, load clients; and their CPU.

Everything the benchmark measures is a production entry point (``python -m cli gateway``
and ``python -m cli worker --engine fake``) over a private ``EmbeddedRedis``, started
through ``shared.supervisor`` so each process is stopped, whatever the exit. The fake
engine's script is plain ASCII, so every token is one character and one SSE frame.

``Sample`` snapshots what a phase's window is measured with: per process CPU seconds
(``/proc``), the gateway's resident memory, and Redis's ``INFO`` (commands, socket reads,
its own CPU). Two samples give ``Usage``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import redis

from bench.scale.counts import RedisCounters, redis_counters
from shared import keys
from shared.redis_server import EmbeddedRedis, free_port
from shared.supervisor import Child, Supervisor, cli_command

MODEL = "scale-model"
SCRIPT = "the quick brown fox jumps over the lazy dog and runs far away "
READY_TIMEOUT_S = 60.0
MAX_MODEL_LEN = 2_000_000


@dataclass(frozen=True)
class WorkerSpec:
    step_delay_s: float
    max_batch_size: int


class Cluster:
    """One Redis, gateways and workers that can be added, killed and replaced between phases."""

    def __init__(self, gateway_args: tuple[str, ...] = ()) -> None:
        self.gateway_args = gateway_args  # extra flags for every gateway (--redis-max-connections=...)
        self.log_dir = Path(tempfile.mkdtemp(prefix="tokenferry-scale-"))
        self.redis = EmbeddedRedis()
        self._gateways = Supervisor(grace_s=10)
        self._workers = Supervisor(grace_s=10)
        self.gateways: dict[int, Child] = {}  # port -> process
        self.workers: dict[str, Child] = {}  # worker id -> process
        self.worker_metrics_ports: dict[str, int] = {}  # worker id -> its /metrics port
        self._serial = 0

    def start(self) -> None:
        self.redis.start()
        self.client = redis.Redis.from_url(self.redis.url)

    def stop(self) -> None:
        self._gateways.stop()
        self._workers.stop()
        self.client.close()
        self.redis.stop()

    def redis_pid(self) -> int:
        return int(cast(dict[str, Any], self.client.info("server"))["process_id"])

    def add_gateway(self, *extra: str) -> int:
        port = free_port()
        flags = ["--port", str(port), "--max-queued-requests", "100000", "--max-streams-per-tenant", "100000"]
        command = cli_command("gateway", "--redis-url", self.redis.url, *flags, *self.gateway_args, *extra)
        self.gateways[port] = self._gateways.start(
            f"gateway-{port}", command, env=self._env({}), output=self.log_dir / f"gateway-{port}.log"
        )
        return port

    def add_worker(self, spec: WorkerSpec) -> str:
        self._serial += 1
        worker_id = f"scale-w{self._serial}"
        flags = ["--engine", "fake", "--model", MODEL, "--worker-id", worker_id]
        metrics_port = free_port()
        flags += ["--max-batch-size", str(spec.max_batch_size), "--metrics-port", str(metrics_port)]
        flags += ["--max-model-len", str(MAX_MODEL_LEN)]  # held streams ask for a million tokens
        self.worker_metrics_ports[worker_id] = metrics_port
        env = self._env(
            {"TOKENFERRY_FAKE_STEP_DELAY_S": str(spec.step_delay_s), "TOKENFERRY_FAKE_SCRIPT": SCRIPT}
        )
        command = cli_command("worker", "--redis-url", self.redis.url, *flags)
        self.workers[worker_id] = self._workers.start(
            worker_id, command, env=env, output=self.log_dir / f"{worker_id}.log"
        )
        return worker_id

    def kill_worker(self, worker_id: str) -> None:
        process = self.workers.pop(worker_id)
        self.worker_metrics_ports.pop(worker_id)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop_workers(self) -> None:
        self._workers.stop()
        self.workers.clear()
        self.worker_metrics_ports.clear()
        self._workers = Supervisor(grace_s=10)

    def stop_gateways(self) -> None:
        self._gateways.stop()
        self.gateways.clear()
        self._gateways = Supervisor(grace_s=10)

    def wait_ready(self) -> None:
        """Until every worker is registered and every gateway lists the model."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._ready():
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"the scale cluster was not ready in {READY_TIMEOUT_S:.0f} s; logs: {self.log_dir}"
        )

    def _ready(self) -> bool:
        for process in [*self.gateways.values(), *self.workers.values()]:
            if process.poll() is not None:
                raise RuntimeError(f"{process.name} exited at start; logs: {self.log_dir}")
        if any(not self.client.exists(keys.worker(worker_id)) for worker_id in self.workers):
            return False
        try:
            for port in self.gateways:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()
                if not any(item["id"] == MODEL for item in models.get("data", [])):
                    return False
        except (httpx.HTTPError, ValueError):
            return False
        return True

    def running(self) -> int:
        return cast(int, self.client.scard(keys.running(MODEL)))

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Until no job runs (the last level's streams were hung up and their jobs aborted)."""
        deadline = time.monotonic() + timeout_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.25)

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        return {**os.environ, "TOKENFERRY_LOG_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1", **extra}


def start_load(plan: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.scale.load", json.dumps(plan)],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
    )


def ramped(process: subprocess.Popen[bytes]) -> int:
    """Wait for a load process's word that its streams stream; how many do."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError("a load process exited during its ramp")
    return int(json.loads(line)["streaming"])


def begin_window(process: subprocess.Popen[bytes], start: float) -> None:
    assert process.stdin is not None
    process.stdin.write(f"{start!r}\n".encode())
    process.stdin.flush()


def finish_load(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=120)
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


@dataclass(frozen=True)
class Sample:
    at: float
    cpu_s: dict[str, float]  # role -> CPU seconds (user + sys), summed over its processes
    gateway_rss: int
    counters: RedisCounters


_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _cpu(pids: Sequence[int]) -> float:
    """User + system CPU seconds of ``pids`` (Linux ``/proc``: no psutil in the serving install)."""
    total = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # it exited
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
        total += (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    return total


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except OSError:
        return 0


def sample(cluster: Cluster, clients: Sequence[subprocess.Popen[bytes]]) -> Sample:
    gateway_pids = [process.pid for process in cluster.gateways.values()]
    rss = sum(_rss(pid) for pid in gateway_pids)
    cpu = {
        "gateway": _cpu(gateway_pids),
        "workers": _cpu([process.pid for process in cluster.workers.values()]),
        "redis": _cpu([cluster.redis_pid()]),
        "client": _cpu([process.pid for process in clients]),
    }
    return Sample(time.time(), cpu, rss, redis_counters(cluster.client))
