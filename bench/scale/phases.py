"""Owns the scale bench's phases: one gateway's stream sweep, Redis and workers, takeover.

Each phase sets the cluster up as it needs, runs load clients over a fixed window and
turns two ``Sample``s around that window into one JSON line.

- ``gateway``: one gateway process, fake workers fast enough not to matter, and ``streams``
  long requests held open (each gets a token every ``step_delay_s``), for each level.
- ``redis``: two gateways, 1, 2, 4, 8 fake workers (a fixed batch and step each) under the
  same load, whole requests back to back: tok/s, Redis commands and reads per token and
  per request, Redis CPU, publishes per worker step (``step_duration_seconds_count``).
- ``takeover``: one stream, two workers; SIGKILL the one running it and time the gap in
  the client's tokens until the stream continues (the other worker's reaper takes over).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import httpx

from bench.scale.cluster import (
    MODEL,
    Cluster,
    WorkerSpec,
    begin_window,
    finish_load,
    ramped,
    sample,
    start_load,
)
from bench.scale.counts import counter_delta, histogram_percentile, merge_histograms, per
from bench.scale.load import LoadPlan, _Load
from shared import keys

_STEPS = re.compile(r"^tokenferry_worker_step_duration_seconds_count\{[^}]*\} ([0-9.e+]+)$", re.M)


@dataclass(frozen=True)
class Window:
    seconds: float
    clients: int  # load processes


def _plan(
    ports: Sequence[int], mode: str, streams: int, max_tokens: int, start: float, window_s: float
) -> dict[str, Any]:
    return {
        "host": "127.0.0.1", "ports": list(ports), "model": MODEL, "mode": mode, "streams": streams,
        "max_tokens": max_tokens, "window_start": start, "window_s": window_s,
    }  # fmt: skip


def measured_window(
    cluster: Cluster, ports: Sequence[int], mode: str, streams: int, max_tokens: int, window: Window
) -> dict[str, Any]:
    """Run the load over one window; the figures every phase shares."""
    per_client = [
        streams // window.clients + (index < streams % window.clients) for index in range(window.clients)
    ]
    plans = [_plan(ports, mode, count, max_tokens, 0.0, window.seconds) for count in per_client if count]
    for plan in plans:
        plan["open_per_s"] = 400.0 / len(plans)  # 400 new streams per second between them
        plan["ramp_timeout_s"] = 20.0 + streams / 100.0
    clients = [start_load(plan) for plan in plans]
    idle_rss = sample(cluster, clients).gateway_rss
    for client in clients:
        ramped(client)
    start = time.time() + 1.0
    for client in clients:
        begin_window(client, start)
    time.sleep(max(0.0, start - time.time()))
    steps_before = worker_steps(cluster)
    before = sample(cluster, clients)
    time.sleep(max(0.0, start + window.seconds - time.time()))
    after = sample(cluster, clients)
    steps = worker_steps(cluster) - steps_before
    results = [finish_load(client) for client in clients]
    return _figures(before, after, results, streams, idle_rss, steps)


def _figures(
    before: Any, after: Any, results: list[dict[str, Any]], streams: int, idle_rss: int, steps: float
) -> dict[str, Any]:
    wall = after.at - before.at
    tokens = sum(result["tokens"] for result in results)
    latency = merge_histograms(result["latency_ms"] for result in results)
    redis = counter_delta(before.counters, after.counters)
    cpu = {role: round((after.cpu_s[role] - before.cpu_s[role]) / wall, 3) for role in after.cpu_s}
    errors: dict[str, int] = {}
    for result in results:
        for kind, count in result["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
    finished = sum(result["requests_finished"] for result in results)
    redis_cores = redis.cpu_s / wall
    return {
        "streams": streams,
        "streaming_at_window_start": sum(result["streaming_at_window_start"] for result in results),
        "window_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "requests_finished": finished,
        "requests_per_s": round(finished / wall, 1),
        "latency_ms_p50": histogram_percentile(latency, 50),
        "latency_ms_p99": histogram_percentile(latency, 99),
        "latency_ms_max": max(latency) if latency else None,
        "cpu_cores": cpu,  # CPU seconds per wall second, per role
        "gateway_cpu_us_per_token": per(1e6 * cpu["gateway"] * wall, tokens, 1),
        "gateway_rss_mb": round(after.gateway_rss / 2**20, 1),
        "gateway_kb_per_stream": per((after.gateway_rss - idle_rss) / 1024, streams, 1),
        "redis_commands_per_token": per(redis.commands, tokens, 3),
        "redis_reads_per_token": per(redis.reads, tokens, 3),
        "redis_commands_per_request": per(redis.commands, finished, 1),
        "redis_reads_per_request": per(redis.reads, finished, 1),
        "redis_tokens_per_s_per_core": per(tokens / wall, redis_cores, 0),
        "redis_top_commands": dict(sorted(redis.calls.items(), key=lambda item: -item[1])[:8]),
        "worker_steps": steps,
        "publish_scripts_per_step": per(redis.calls.get("evalsha", 0), steps, 3),
        "errors": errors,
    }


def worker_steps(cluster: Cluster) -> float:
    """Engine steps with work so far, summed over the workers (their /metrics)."""
    total = 0.0
    for port in cluster.worker_metrics_ports.values():
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            continue
        total += sum(float(value) for value in _STEPS.findall(text))
    return total


def gateway_phase(
    cluster: Cluster, levels: Sequence[int], step_delay_s: float, window: Window, workers: int
) -> list[dict[str, Any]]:
    """One gateway; for each level, that many held streams of a token every ``step_delay_s``."""
    port = cluster.add_gateway()
    batch = max(levels) // workers + 16
    for _ in range(workers):
        cluster.add_worker(WorkerSpec(step_delay_s, batch))
    cluster.wait_ready()
    lines = []
    for streams in levels:
        clients = 1 if streams <= 1000 else window.clients
        line = measured_window(cluster, [port], "hold", streams, 1_000_000, Window(window.seconds, clients))
        line.update(
            phase="gateway", step_delay_s=step_delay_s, offered_tokens_per_s=round(streams / step_delay_s)
        )
        lines.append(line)
        yield_line(line)
        cluster.wait_idle()
    cluster.stop_workers()
    cluster.stop_gateways()
    return lines


def saturation_phase(
    cluster: Cluster, streams: int, step_delay_s: float, window: Window, workers: int
) -> dict[str, Any]:
    """One gateway offered more tokens than it can relay: the most it relays, and its batching."""
    lines = gateway_phase(cluster, [streams], step_delay_s, Window(window.seconds, 1), workers)
    lines[0]["phase"] = "saturation"
    return lines[0]


def redis_phase(
    cluster: Cluster,
    worker_counts: Sequence[int],
    spec: WorkerSpec,
    window: Window,
    gateways: int,
    max_tokens: int,
) -> list[dict[str, Any]]:
    ports = [cluster.add_gateway() for _ in range(gateways)]
    streams = max(worker_counts) * spec.max_batch_size
    lines = []
    for count in worker_counts:
        while len(cluster.workers) < count:
            cluster.add_worker(spec)
        cluster.wait_ready()
        line = measured_window(cluster, ports, "loop", streams, max_tokens, window)
        line.update(phase="redis", workers=count, gateways=gateways, step_delay_s=spec.step_delay_s,
                    max_batch_size=spec.max_batch_size, max_tokens=max_tokens)  # fmt: skip
        lines.append(line)
        yield_line(line)
        cluster.wait_idle()
    base = lines[0]["tokens_per_s"]
    for line in lines:
        line["speedup_vs_1_worker"] = per(line["tokens_per_s"], base, 2)
    cluster.stop_workers()
    cluster.stop_gateways()
    return lines


def takeover_phase(cluster: Cluster, rounds: int, step_delay_s: float) -> dict[str, Any]:
    port = cluster.add_gateway()
    for _ in range(2):
        cluster.add_worker(WorkerSpec(step_delay_s, 8))
    cluster.wait_ready()
    gaps = [asyncio.run(_one_takeover(cluster, port, step_delay_s)) for _ in range(rounds)]
    cluster.stop_workers()
    cluster.stop_gateways()
    measured = [gap for gap in gaps if gap is not None]
    line = {
        "phase": "takeover",
        "rounds": rounds,
        "continued": len(measured),
        "gap_s": [round(gap, 2) for gap in measured],
        "gap_s_max": round(max(measured), 2) if measured else None,
        "normal_gap_s": step_delay_s,
    }
    yield_line(line)
    return line


async def _one_takeover(cluster: Cluster, port: int, step_delay_s: float) -> float | None:
    """Seconds between the last token before a SIGKILL of the stream's worker and the next one."""
    plan = LoadPlan(**_plan([port], "hold", 1, 100_000, time.time(), 30.0))
    load = _Load(plan)
    task = asyncio.create_task(load.one_request(port))
    await _tokens_beyond(load, 20, timeout_s=30)  # streaming from one worker
    if task.done():
        return None
    victim = _owner(cluster)
    tokens_at_kill = load.result.tokens
    cluster.kill_worker(victim)
    killed_at = time.time()
    await _tokens_beyond(load, tokens_at_kill + 1, timeout_s=25)
    continued_at = time.time()
    task.cancel()
    cluster.add_worker(WorkerSpec(step_delay_s, 8))  # back to two for the next round
    await asyncio.to_thread(cluster.wait_ready)
    await asyncio.to_thread(cluster.wait_idle)
    if load.result.tokens <= tokens_at_kill + 1:
        return None
    return continued_at - killed_at


async def _tokens_beyond(load: _Load, count: int, timeout_s: float) -> None:
    """Until the stream has more than ``count`` tokens (polled: the client counts, it signals nothing)."""
    for _ in range(int(timeout_s / 0.01)):
        if load.result.tokens > count:
            return
        await asyncio.sleep(0.01)


def _owner(cluster: Cluster) -> str:
    members = cast(set[bytes], cluster.client.smembers(keys.running(MODEL)))
    for member in members:
        owner = cast(bytes | None, cluster.client.hget(keys.run(member.decode()), "owner"))
        if owner:
            worker_id = owner.decode().split("/")[0]
            if worker_id in cluster.workers:
                return worker_id
    raise RuntimeError("no running request has a live owner")


def yield_line(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)
