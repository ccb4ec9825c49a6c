"""Owns the scale bench's arithmetic: Redis counter deltas and percentiles of latency histograms.

Redis counts for us, so nothing on the hot path is wrapped:

- commands: ``INFO stats`` ``total_commands_processed``, and per command ``INFO
  commandstats`` ``calls`` (a Lua script's inner XADDs count there as their own calls);
- round trips: ``INFO stats`` ``total_reads_processed``, the socket reads Redis served.
  A client that writes one command or one pipeline and waits for the answer costs one
  read; a pipeline past Redis's 16 kB read buffer costs more than one, and a blocked
  XREAD costs one read when sent, none when it wakes. So reads per token is a close,
  slightly high, count of round trips per token;
- Redis's CPU: ``INFO cpu`` ``used_cpu_user + used_cpu_sys``.

Our own ``INFO`` calls between two samples are counted too (a handful, next to
thousands of commands per second under load).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis


@dataclass(frozen=True)
class RedisCounters:
    commands: int
    reads: int
    cpu_s: float
    calls: Mapping[str, int]  # command name -> calls


def parse_counters(
    stats: Mapping[str, Any], cpu: Mapping[str, Any], commandstats: Mapping[str, Any]
) -> RedisCounters:
    """Counters from the three ``INFO`` sections as redis-py parses them."""
    calls = {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in commandstats.items()
        if isinstance(value, Mapping)
    }
    return RedisCounters(
        commands=int(stats["total_commands_processed"]),
        reads=int(stats["total_reads_processed"]),
        cpu_s=float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        calls=calls,
    )


def redis_counters(client: redis.Redis) -> RedisCounters:
    sections = [cast(Mapping[str, Any], client.info(section)) for section in ("stats", "cpu", "commandstats")]
    return parse_counters(*sections)


def counter_delta(before: RedisCounters, after: RedisCounters) -> RedisCounters:
    calls = {name: after.calls[name] - before.calls.get(name, 0) for name in after.calls}
    return RedisCounters(
        commands=after.commands - before.commands,
        reads=after.reads - before.reads,
        cpu_s=after.cpu_s - before.cpu_s,
        calls={name: count for name, count in calls.items() if count},
    )


def merge_histograms(histograms: Iterable[Mapping[str | int, int]]) -> Counter[int]:
    """Sum histograms keyed by bin (JSON turns the int keys into strings)."""
    merged: Counter[int] = Counter()
    for histogram in histograms:
        for key, count in histogram.items():
            merged[int(key)] += count
    return merged


def histogram_percentile(histogram: Mapping[int, int], q: float) -> int | None:
    """The smallest bin at or below which at least q percent (0..100) of the samples lie."""
    total = sum(histogram.values())
    if total == 0:
        return None
    needed = total * q / 100.0
    seen = 0
    for key in sorted(histogram):
        seen += histogram[key]
        if seen >= needed:
            return key
    return max(histogram)


def per(amount: float, count: float, digits: int = 2) -> float | None:
    """amount / count rounded, or None when there is nothing to divide by."""
    return round(amount / count, digits) if count else None
