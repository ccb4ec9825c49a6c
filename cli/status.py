"""Owns ``tokenferry status``: a live terminal view of the cluster, read from Redis.

It shows what Redis knows, the same view every gateway has: live workers (from
their heartbeats, with the load each one last reported) and the depth of every
queue lane. It redraws every ``--interval`` seconds until Ctrl-C; ``--once``
prints one snapshot and exits (for scripts and tests). Imports neither tier.
With model groups (``--redis-groups``, from the environment or ``--config``) it reads
the home Redis and every group's, and shows them as one cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.exceptions import RedisError

from cli import options
from shared import cluster
from shared.redis_connect import async_client
from shared.registry import WorkerInfo

_CLEAR_SCREEN = "\x1b[H\x1b[2J"
_TIMEOUT_S = 2.0


def add_status_command(commands: Any) -> None:
    """Register ``status`` on the ``tokenferry`` subcommand parser."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "status",
        help="live view of workers, load and queues, from Redis",
        description="Live view of the cluster: workers, their models and load, queue depths.",
        argument_default=argparse.SUPPRESS,
    )
    flags = options.add_redis_flag(parser) + [
        parser.add_argument("--interval", dest="interval_s", type=float, metavar="S", help="refresh period")
    ]
    parser.add_argument("--once", action="store_true", default=False, help="print one snapshot and exit")
    parser.set_defaults(handler=lambda args: run_status(options.given(args, flags), once=args.once))


def run_status(values: dict[str, Any], *, once: bool) -> int:
    from shared.settings import StatusSettings

    settings = StatusSettings(**values)
    try:
        urls = settings.model_groups().urls()
        return asyncio.run(_watch(urls, settings.interval_s, once=once))
    except KeyboardInterrupt:
        return 0


async def _watch(urls: Sequence[str], interval_s: float, *, once: bool) -> int:
    """Redraw the snapshot of the Redis servers at ``urls`` (home first, then the model groups')."""
    clients = [
        async_client(url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S) for url in urls
    ]
    source = redact(urls[0]) + (f" + {len(urls) - 1} model group(s)" if len(urls) > 1 else "")
    is_live = not once and sys.stdout.isatty()
    try:
        while True:
            try:
                snapshots = [await cluster.read_snapshot(redis) for redis in clients]
                screen = render(cluster.merged(snapshots), source)
            except (RedisError, OSError) as error:
                problem = f"tokenferry status: cannot read Redis at {source}: {error}"
                if once:
                    print(problem, file=sys.stderr)
                    return 1
                screen = problem + " (retrying)\n"
            print((_CLEAR_SCREEN if is_live else "") + screen, flush=True)
            if once:
                return 0
            await asyncio.sleep(interval_s)
    finally:
        for redis in clients:
            await redis.aclose()


def render(snapshot: cluster.ClusterSnapshot, source: str) -> str:
    """The whole screen for one snapshot: a header, the workers table, the queues table."""
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.taken_at))
    total_rate = sum(worker.load.generation_tokens_per_s for worker in snapshot.workers if worker.load)
    lines = [
        f"tokenferry status  {taken}  {source}",
        "",
        f"WORKERS: {len(snapshot.workers)} live, {total_rate:.1f} tok/s generated",
    ]
    if snapshot.workers:
        rows = [_worker_row(worker, snapshot.taken_at) for worker in snapshot.workers]
        lines += table(("WORKER", "MODEL", "HEARTBEAT", "RUNNING", "WAITING", "TOK/S"), rows)
    else:
        lines.append("  (none)")
    lines += ["", "QUEUES: jobs not yet finished (waiting, or running on a worker)"]
    if snapshot.queues:
        queue_rows = [(queue.model, queue.lane.value, str(queue.jobs)) for queue in snapshot.queues]
        lines += table(("MODEL", "LANE", "JOBS"), queue_rows)
    else:
        lines.append("  (no model served yet)")
    return "\n".join(lines) + "\n"


def _worker_row(worker: WorkerInfo, now: float) -> tuple[str, ...]:
    age = "?" if worker.heartbeat_at is None else f"{max(0.0, now - worker.heartbeat_at):.1f}s ago"
    if worker.load is None:  # an older worker that reports no load
        return (worker.worker_id, worker.model, age, "-", "-", "-")
    load = worker.load
    return (
        worker.worker_id,
        worker.model,
        age,
        str(load.running),
        str(load.waiting),
        f"{load.generation_tokens_per_s:.1f}",
    )


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Left-aligned text columns, numbers right-aligned, two spaces apart."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    numeric = [all(_is_number(row[index]) for row in rows) for index in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        padded = (
            cell.rjust(width) if is_numeric else cell.ljust(width)
            for cell, width, is_numeric in zip(cells, widths, numeric, strict=True)
        )
        return ("  " + "  ".join(padded)).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _is_number(cell: str) -> bool:
    return cell == "-" or cell.replace(".", "", 1).isdigit()


def redact(url: str) -> str:
    """``url`` without its password, fit for a screen."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
