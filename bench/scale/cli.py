"""Owns ``make bench-scale``: options, the phases in order, one table per phase, the JSON file.

stdout carries one JSON line per measurement as it ends, then the tables; the same
lines, with the run's options, go to ``bench/results/scale-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.scale.cluster import Cluster, WorkerSpec
from bench.scale.phases import Window, gateway_phase, redis_phase, saturation_phase, takeover_phase

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def _ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small levels and short windows (~2 min)")
    parser.add_argument("--phases", default="gateway,saturation,redis,takeover")
    parser.add_argument("--streams", type=_ints, help="gateway phase levels (default 100,500,1000,2000,4000)")
    parser.add_argument(
        "--step-delay", type=float, default=0.2, help="gateway phase: seconds between a stream's tokens"
    )
    parser.add_argument(
        "--gateway-workers", type=int, default=2, help="fake workers feeding the gateway phase"
    )
    parser.add_argument(
        "--saturation", default="300:0.02", help="saturation phase: STREAMS:STEP_DELAY (300 x 50 tok/s)"
    )
    parser.add_argument("--workers", type=_ints, help="redis phase worker counts (default 1,2,4,8)")
    parser.add_argument("--worker-batch", type=int, default=32, help="redis phase: each worker's max batch")
    parser.add_argument("--worker-step-delay", type=float, default=0.05, help="redis phase: fake step time")
    parser.add_argument("--request-tokens", type=int, default=64, help="redis phase: tokens per request")
    parser.add_argument("--gateways", type=int, default=2, help="redis phase: gateway processes")
    parser.add_argument("--window", type=float, help="seconds measured per level (default 15, quick 8)")
    parser.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        help="a flag for every gateway, e.g. --gateway-arg=--redis-max-connections=2048 (repeatable)",
    )
    parser.add_argument("--clients", type=int, default=2, help="load processes for big levels")
    parser.add_argument(
        "--takeovers", type=int, help="worker kills in the takeover phase (default 3, quick 1)"
    )
    args = parser.parse_args(argv)
    args.streams = args.streams or ([100, 500] if args.quick else [100, 500, 1000, 2000, 4000])
    args.workers = args.workers or ([1, 2] if args.quick else [1, 2, 4, 8])
    args.window = args.window or (8.0 if args.quick else 15.0)
    args.takeovers = args.takeovers or (1 if args.quick else 3)
    return args


def _git() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return head + ("-dirty" if dirty else "")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    phases = set(args.phases.split(","))
    window = Window(args.window, args.clients)
    lines: list[dict[str, Any]] = []
    cluster = Cluster(tuple(args.gateway_arg))
    try:
        cluster.start()
        if "gateway" in phases:
            lines += gateway_phase(cluster, args.streams, args.step_delay, window, args.gateway_workers)
        if "saturation" in phases:
            streams, delay = args.saturation.split(":")
            lines.append(saturation_phase(cluster, int(streams), float(delay), window, args.gateway_workers))
        if "redis" in phases:
            spec = WorkerSpec(args.worker_step_delay, args.worker_batch)
            lines += redis_phase(cluster, args.workers, spec, window, args.gateways, args.request_tokens)
        if "takeover" in phases:
            lines.append(takeover_phase(cluster, args.takeovers, 0.02))
    finally:
        cluster.stop()
        print(f"logs in {cluster.log_dir}", file=sys.stderr)
    return lines


def _table(title: str, columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> str:
    header = [name for name, _ in columns]
    body = [[_cell(_get(row, key)) for _, key in columns] for row in rows]
    widths = [max(len(item) for item in column) for column in zip(header, *body, strict=True)]
    lines = [title, "  ".join(name.rjust(width) for name, width in zip(header, widths, strict=True))]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in body]
    return "\n".join(lines)


def _get(row: dict[str, Any], key: str) -> Any:
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


CPU = [
    ("gw cpu", "cpu_cores.gateway"),
    ("wk cpu", "cpu_cores.workers"),
    ("redis cpu", "cpu_cores.redis"),
    ("client cpu", "cpu_cores.client"),
]
GATEWAY_COLUMNS = [
    ("streams", "streams"),
    ("streaming", "streaming_at_window_start"),
    ("offered tok/s", "offered_tokens_per_s"),
    ("tok/s", "tokens_per_s"),
    ("p50 ms", "latency_ms_p50"),
    ("p99 ms", "latency_ms_p99"),
    ("gw us/tok", "gateway_cpu_us_per_token"),
    ("gw MB", "gateway_rss_mb"),
    ("kB/stream", "gateway_kb_per_stream"),
    *CPU,
    ("errors", "errors"),
]
REDIS_COLUMNS = [
    ("workers", "workers"),
    ("tok/s", "tokens_per_s"),
    ("x 1 worker", "speedup_vs_1_worker"),
    ("req/s", "requests_per_s"),
    ("cmd/tok", "redis_commands_per_token"),
    ("reads/tok", "redis_reads_per_token"),
    ("cmd/req", "redis_commands_per_request"),
    ("reads/req", "redis_reads_per_request"),
    ("publish/step", "publish_scripts_per_step"),
    ("tok/s per redis core", "redis_tokens_per_s_per_core"),
    ("p99 ms", "latency_ms_p99"),
    *CPU,
]


def tables(lines: list[dict[str, Any]]) -> str:
    parts = []
    gateway = [line for line in lines if line.get("phase") in ("gateway", "saturation")]
    if gateway:
        parts.append(
            _table("one gateway process: held streams (CPU in cores of 2)", GATEWAY_COLUMNS, gateway)
        )
    redis = [line for line in lines if line.get("phase") == "redis"]
    if redis:
        parts.append(_table("one Redis: fake workers, whole requests (req/s)", REDIS_COLUMNS, redis))
    for line in lines:
        if line.get("phase") == "takeover":
            continued = f"{line['continued']}/{line['rounds']} continued"
            parts.append(f"takeover after SIGKILL: gaps {line['gap_s']} s ({continued})")
    return "\n\n".join(parts)


def main() -> None:
    args = parse_args()
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    header = {
        "kind": "run",
        **vars(args),
        "git": _git(),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "started_at": started,
    }
    print(json.dumps(header), flush=True)
    lines = run(args)
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"scale-{started}.json"
    path.write_text(
        json.dumps({"run": header, "lines": lines, "loadavg_1m_end": os.getloadavg()[0]}, indent=1)
    )
    print()
    print(tables(lines))
    print(f"\nresults in {path}")
