"""Owns the local cluster's life: plan the topology, start it in order, wait until it serves, stop it all.

Start order follows the dependencies: Redis, then workers and gateways, then nginx
once every gateway answers ``/health``. The cluster is ready when nginx lists a
model and every worker has registered. Stop order is the reverse, Redis last, so that
draining workers can still hand their jobs over. If any process dies, everything
stops: a half cluster is worse than a clear exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from deploy.cluster import nginx
from deploy.cluster.processes import Child, first_exited, spawn, stop
from deploy.cluster.redis_probe import live_worker_count, ping
from shared.redis_server import find_redis_binary, free_port

READY_LINE = "tokenferry cluster ready at"


class _Stop(Exception):
    """Ctrl-C or SIGTERM arrived; unwinds the supervisor from its wait loops."""


class _Failed(Exception):
    """A process exited during start-up, or the cluster was not ready in time."""


@dataclass(frozen=True)
class Plan:
    """Every process's command line, and where each one listens."""

    redis_url: str
    redis: list[str]
    workers: list[list[str]]
    gateways: list[list[str]]
    nginx: list[str]
    gateway_urls: list[str]
    url: str


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.cluster",
        description="Redis (AOF on), nginx in front of N gateways, and M workers as local processes.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="nginx's address")
    parser.add_argument("--port", type=int, default=8080, help="nginx's port")
    parser.add_argument("--gateways", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engine", choices=["transformers", "fake"], help="workers' engine")
    parser.add_argument("--model", help="workers' model (default: the bundled one)")
    parser.add_argument("--nginx", type=Path, help="nginx binary (default: the one make setup unpacked)")
    parser.add_argument("--ready-timeout", type=float, default=600.0, metavar="S")
    parser.add_argument("--stop-timeout", type=float, default=45.0, metavar="S", help="drain time per tier")
    return parser


def plan(args: argparse.Namespace, run_dir: Path, nginx_binary: Path) -> Plan:
    """Pick ports, write nginx's config into ``run_dir`` and spell every command line."""
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    gateway_ports = [free_port() for _ in range(args.gateways)]
    tokenferry = [sys.executable, "-m", "cli"]
    worker_flags = [
        part
        for name in ("engine", "model")
        if getattr(args, name)
        for part in (f"--{name}", getattr(args, name))
    ]
    upstreams = [f"127.0.0.1:{port}" for port in gateway_ports]
    config = nginx.write_config(f"{args.host}:{args.port}", upstreams, run_dir)
    client_host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    return Plan(
        redis_url=redis_url,
        redis=_redis_command(redis_port, run_dir / "redis"),
        workers=[[*tokenferry, "worker", "--redis-url", redis_url, *worker_flags]] * args.workers,
        gateways=[
            [*tokenferry, "gateway", "--redis-url", redis_url, "--host", "127.0.0.1", "--port", str(port)]
            for port in gateway_ports
        ],
        nginx=nginx.command(nginx_binary, run_dir, config),
        gateway_urls=[f"http://{address}" for address in upstreams],
        url=f"http://{client_host}:{args.port}/v1",
    )


def _redis_command(port: int, data_dir: Path) -> list[str]:
    """redis-server with the append-only file on, as in compose and Kubernetes."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return [
        str(find_redis_binary()),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--maxmemory-policy", "noeviction",
        "--loglevel", "warning",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        nginx_binary = nginx.find_nginx(args.nginx)
    except nginx.NginxNotFound as error:
        print(f"tokenferry cluster: {error}", file=sys.stderr)
        return 1
    stop_event = _stop_on_signals()
    with tempfile.TemporaryDirectory(prefix="tokenferry-cluster-") as run_dir:
        return run(plan(args, Path(run_dir), nginx_binary), args, stop_event)


def run(topology: Plan, args: argparse.Namespace, stop_event: threading.Event) -> int:
    """Start the tiers in order, serve until a signal or a death, then stop them in reverse."""
    redis: list[Child] = []
    tiers: list[Child] = []
    front: list[Child] = []
    try:
        redis.append(spawn("redis", topology.redis))
        _wait(lambda: ping(topology.redis_url), redis, stop_event, 10.0, "Redis")
        tiers += [spawn(f"worker-{i}", argv, _worker_env(i)) for i, argv in enumerate(topology.workers, 1)]
        tiers += [spawn(f"gateway-{i}", argv) for i, argv in enumerate(topology.gateways, 1)]
        _wait(lambda: _gateways_answer(topology), redis + tiers, stop_event, args.ready_timeout, "gateways")
        front.append(spawn("nginx", topology.nginx))
        everyone = redis + tiers + front
        _wait(lambda: _serving(topology), everyone, stop_event, args.ready_timeout, "the cluster")
        _print_banner(topology, args)
        return _wait_for_exit(everyone, stop_event)
    except _Stop:
        return 0
    except _Failed as failure:
        print(f"tokenferry cluster: {failure}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon the children
        stop(front, args.stop_timeout)
        stop(tiers, args.stop_timeout)
        stop(redis, args.stop_timeout)
        print("tokenferry cluster: stopped", file=sys.stderr, flush=True)


def _worker_env(index: int) -> dict[str, str]:
    # Named workers make `tokenferry status` and the logs readable.
    return {**os.environ, "TOKENFERRY_WORKER_ID": f"cluster-worker-{index}"}


def _stop_on_signals() -> threading.Event:
    """An event set by Ctrl-C or SIGTERM, polled by the wait loops (raising in a handler can cut a write)."""
    event = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        event.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    return event


def _wait(
    condition: Callable[[], bool],
    children: list[Child],
    stop_event: threading.Event,
    timeout_s: float,
    what: str,
) -> None:
    """Poll ``condition`` until it holds; fail if a child exits or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = first_exited(children)
        if exited is not None:
            raise _Failed(f"{exited.name} exited with code {exited.process.returncode} during start-up")
        with contextlib.suppress(OSError, ValueError):  # not listening yet, or a half-started reply
            if condition():
                return
        if stop_event.wait(0.3):
            raise _Stop
    raise _Failed(f"{what} was not ready within {timeout_s:.0f} s")


def _gateways_answer(topology: Plan) -> bool:
    for url in topology.gateway_urls:
        _get_json(f"{url}/health")  # raises until it answers 200
    return True


def _serving(topology: Plan) -> bool:
    """A model listed through nginx, and every worker registered."""
    models = _get_json(f"{topology.url}/models").get("data")
    return bool(models) and live_worker_count(topology.redis_url) >= len(topology.workers)


def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=2) as response:
        loaded = json.load(response)
    if not isinstance(loaded, dict):
        raise ValueError(f"{url} answered {loaded!r}")
    return loaded


def _wait_for_exit(children: list[Child], stop_event: threading.Event) -> int:
    while not stop_event.wait(0.5):
        exited = first_exited(children)
        if exited is not None:
            code = exited.process.returncode
            print(f"tokenferry cluster: {exited.name} exited with code {code}; stopping all", file=sys.stderr)
            return code or 1
    return 0


def _print_banner(topology: Plan, args: argparse.Namespace) -> None:
    print(
        f"""
{READY_LINE} {topology.url}
  nginx on {args.host}:{args.port} -> {len(topology.gateways)} gateways -> Redis (AOF on) at \
{topology.redis_url} <- {len(topology.workers)} workers. Ctrl-C stops everything.

  .venv/bin/tokenferry chat --base-url {topology.url}
""",
        flush=True,
    )
