"""Owns the output: one JSON line per measurement on stdout as it happens, then ratios and a table.

Every JSON line has ``kind`` (``run``, ``reference_naive``,
``reference_static_batch``, ``reference_continuous_batching``, ``gateway``,
``ratio``) and ``schema`` (bumped when a field changes meaning), so lines from
several runs can be concatenated and filtered with ``jq``. Progress notes go to
stderr, keeping stdout machine-readable up to the table, which follows a blank line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA = 1


@dataclass
class Results:
    """Everything measured in one run, keyed by concurrency where it has one."""

    naive: dict[str, Any] | None = None
    static: dict[int, dict[str, Any]] = field(default_factory=dict)
    continuous: dict[int, dict[str, Any]] = field(default_factory=dict)
    engine: dict[int, dict[str, Any]] = field(default_factory=dict)
    gateway: dict[int, dict[str, Any]] = field(default_factory=dict)


def emit(kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Print one JSON line and return it.

    ``loadavg_1m`` is the 1-minute load average when the measurement ended: on a
    2-core box anything much above what the benchmark itself runs (about 2)
    means another process took CPU and the numbers are low.
    """
    line = {"kind": kind, "schema": SCHEMA, **fields, "loadavg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(line), flush=True)
    return line


def note(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)


def ratios(results: Results) -> list[dict[str, Any]]:
    """Gateway tokens/s over the naive server and over the static batch at the same C."""
    naive_rate = results.naive["output_tokens_per_s"] if results.naive else None
    lines = []
    for concurrency, gateway in sorted(results.gateway.items()):
        rate = gateway.get("output_tokens_per_s")
        static_rate = results.static.get(concurrency, {}).get("output_tokens_per_s")
        lines.append(
            {
                "concurrency": concurrency,
                "gateway_tokens_per_s": rate,
                "vs_naive": _ratio(rate, naive_rate),
                "vs_static_batch": _ratio(rate, static_rate),
            }
        )
    return lines


def _cell(value: Any, width: int) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, float):
        text = f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    else:
        text = str(value)
    return text.rjust(width)


def _row(values: list[Any], widths: list[int]) -> str:
    return " ".join(_cell(value, width) for value, width in zip(values, widths, strict=True))


_GATEWAY_HEADER = ["C", "sent", "err", "trunc", "tok/s", "TTFT50ms", "TTFT99ms", "ITL50ms", "ITL99ms"]
_GATEWAY_HEADER += ["TPOT50ms", "tok/chunk", "x naive", "x static"]


def _gateway_table(results: Results) -> list[str]:
    widths = [max(5, len(name)) for name in _GATEWAY_HEADER]
    lines = [_row(list(_GATEWAY_HEADER), widths)]
    by_c = {line["concurrency"]: line for line in ratios(results)}
    for concurrency, level in sorted(results.gateway.items()):
        keys = ["requests_sent", "errors", "truncated_requests", "output_tokens_per_s"]
        keys += ["ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "tpot_ms_p50", "tokens_per_chunk"]
        values = [concurrency, *(level.get(key) for key in keys)]
        values += [by_c[concurrency]["vs_naive"], by_c[concurrency]["vs_static_batch"]]
        lines.append(_row(values, widths))
    return lines


def _reference_table(results: Results) -> list[str]:
    header = ["C", "static tok/s", "generate_batch tok/s", "engine tok/s", "engine x static"]
    widths = [5, 12, 20, 12, 15]
    lines = [_row(header, widths) + " note"]
    for concurrency in sorted(set(results.static) | set(results.continuous)):
        static = results.static.get(concurrency, {})
        continuous = results.continuous.get(concurrency, {})
        engine_rate = results.engine.get(concurrency, {}).get("output_tokens_per_s")
        remark = continuous.get("error") or continuous.get("skipped") or ""
        if static.get("partial"):
            remark = f"static capped by --max-seconds-per-level. {remark}"
        static_rate = static.get("output_tokens_per_s")
        row = [concurrency, static_rate, continuous.get("output_tokens_per_s"), engine_rate]
        lines.append(_row([*row, _ratio(engine_rate, static_rate)], widths) + f" {remark[:80]}")
    return lines


def table(results: Results, output_tokens: int) -> str:
    """The human-readable summary printed after the JSON lines."""
    parts = [f"\n== tokenferry bench: {output_tokens} forced output tokens per request =="]
    if results.naive:
        naive = results.naive
        parts.append(
            f"naive (model.generate, one request at a time, {naive['requests']} requests): "
            f"{naive['output_tokens_per_s']} tok/s"
        )
    if results.static or results.continuous:
        parts += ["", "in-process references (same C prompts arriving together):", *_reference_table(results)]
    if results.gateway:
        parts += ["", "gateway sweep (HTTP + Redis + worker, streamed):", *_gateway_table(results)]
    return "\n".join(parts)
