"""Owns the local cluster's life: plan the topology, start it in order, wait until it serves, stop it all.

Start order follows the dependencies: Redis, then workers and gateways, then nginx
once every gateway answers ``/health``. The cluster is ready when nginx lists a
model and every worker has registered. Stop order is the reverse, Redis last, so that
draining workers can still hand their jobs over. If any process dies, everything
stops: a half cluster is worse than a clear exit.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deploy.cluster import nginx
from deploy.cluster.redis_probe import live_worker_count, ping
from shared.redis_server import RedisServerError, find_redis_binary, free_port
from shared.supervisor import (
    Child,
    StopRequested,
    Supervisor,
    SupervisorError,
    cli_command,
    ctrl_c_ignored,
    get_json,
    stop_on_signals,
    wait_until,
    watch,
)

READY_LINE = "tokenferry cluster ready at"


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
        workers=[cli_command("worker", "--redis-url", redis_url, *worker_flags)] * args.workers,
        gateways=[
            cli_command("gateway", "--redis-url", redis_url, "--host", "127.0.0.1", "--port", str(port))
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
        find_redis_binary()  # fails here, in one line, rather than mid-plan
    except (nginx.NginxNotFound, RedisServerError) as error:
        print(f"tokenferry cluster: {error}", file=sys.stderr)
        return 1
    stop_event = stop_on_signals()
    with tempfile.TemporaryDirectory(prefix="tokenferry-cluster-") as run_dir:
        return run(plan(args, Path(run_dir), nginx_binary), args, stop_event)


@dataclass(frozen=True)
class _Tiers:
    """One supervisor per tier, stopped front to back: nginx, then gateways and workers, Redis last."""

    redis: Supervisor
    servers: Supervisor
    front: Supervisor


def run(topology: Plan, args: argparse.Namespace, stop_event: threading.Event) -> int:
    """Start the tiers in order, serve until a signal or a death, then stop them in reverse."""
    grace_s = args.stop_timeout
    tiers = _Tiers(redis=Supervisor(grace_s), servers=Supervisor(grace_s), front=Supervisor(grace_s))
    try:
        return _start_and_serve(topology, args, stop_event, tiers)
    except StopRequested:
        return 0
    except SupervisorError as failure:  # a process exited during start-up, or a tier was not ready in time
        print(f"tokenferry cluster: {failure}", file=sys.stderr)
        return 1
    finally:
        with ctrl_c_ignored():  # a second Ctrl-C must not abandon the children
            for tier in (tiers.front, tiers.servers, tiers.redis):
                tier.stop()
        print("tokenferry cluster: stopped", file=sys.stderr, flush=True)


def _start_and_serve(
    topology: Plan, args: argparse.Namespace, stop_event: threading.Event, tiers: _Tiers
) -> int:
    tiers.redis.start("redis", topology.redis)
    _wait(lambda: ping(topology.redis_url), tiers.redis.children, stop_event, 10.0, "Redis")
    for i, argv in enumerate(topology.workers, 1):
        tiers.servers.start(f"worker-{i}", argv, env=_worker_env(i))
    for i, argv in enumerate(topology.gateways, 1):
        tiers.servers.start(f"gateway-{i}", argv)
    started = tiers.redis.children + tiers.servers.children
    _wait(lambda: _gateways_answer(topology), started, stop_event, args.ready_timeout, "gateways")
    tiers.front.start("nginx", topology.nginx)
    everyone = started + tiers.front.children
    _wait(lambda: _serving(topology), everyone, stop_event, args.ready_timeout, "the cluster")
    _print_banner(topology, args)
    exited = watch(everyone, stop_event)
    if exited is None:
        return 0
    code = exited.returncode
    print(f"tokenferry cluster: {exited.name} exited with code {code}; stopping all", file=sys.stderr)
    return code or 1


def _worker_env(index: int) -> dict[str, str]:
    # Named workers make `tokenferry status` and the logs readable.
    return {**os.environ, "TOKENFERRY_WORKER_ID": f"cluster-worker-{index}"}


def _wait(
    condition: Callable[[], bool],
    children: list[Child],
    stop_event: threading.Event,
    timeout_s: float,
    what: str,
) -> None:
    wait_until(condition, children, timeout_s=timeout_s, what=what, interval_s=0.3, stop_event=stop_event)


def _gateways_answer(topology: Plan) -> bool:
    for url in topology.gateway_urls:
        get_json(f"{url}/health")  # raises until it answers 200
    return True


def _serving(topology: Plan) -> bool:
    """A model listed through nginx, and every worker registered."""
    models = get_json(f"{topology.url}/models").get("data")
    return bool(models) and live_worker_count(topology.redis_url) >= len(topology.workers)


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
