"""Owns the output: one JSON line per measurement on stdout as it happens, then ratios and a table.

Every JSON line has ``kind`` (``run``, ``reference_naive``, ``reference_prefill``,
``reference_static_batch``, ``reference_engine``, ``reference_continuous_batching``,
``gateway``, ``ratio``, ``reference_structured``, ``gateway_structured``) and ``schema``
(bumped when a field changes meaning), so lines from
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

from bench.stats import percentile

# 2: reference_engine runs the worker-configured (oneDNN-packed) model; C=1 sends 8 requests;
# reference_prefill, ratio.vs_generate_batch and ratio.ttft_minus_prefill_ms are new.
# 3: C=1 sends 16 requests; reference_prefill is measured interleaved with them (each prompt in
# process right after its served request), not in the references phase, and has `paired` and
# `pairs`; its cap counts only its own time; ratio.ttft_minus_prefill_ms_paired_p50 is new; the
# C=1 gateway line's wall_s leaves out the reference's time, and its requests open a connection each.
# 4: the structured-output phase's `reference_structured` and `gateway_structured` lines are new.
SCHEMA = 4


@dataclass
class Results:
    """Everything measured in one run, keyed by concurrency where it has one."""

    naive: dict[str, Any] | None = None
    prefill: dict[str, Any] | None = None
    static: dict[int, dict[str, Any]] = field(default_factory=dict)
    continuous: dict[int, dict[str, Any]] = field(default_factory=dict)
    engine: dict[int, dict[str, Any]] = field(default_factory=dict)
    gateway: dict[int, dict[str, Any]] = field(default_factory=dict)
    structured_engine: dict[str, Any] | None = None
    structured_gateway: dict[str, Any] | None = None


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


def _difference(minuend: float | None, subtrahend: float | None) -> float | None:
    if minuend is None or subtrahend is None:
        return None
    return round(minuend - subtrahend, 2)


def _paired_difference_p50(prefill: Mapping[str, Any] | None) -> float | None:
    """The median over requests of (served TTFT - in-process prefill), when they were measured in pairs."""
    pairs = prefill.get("pairs", []) if prefill else []
    median = percentile([pair["ttft_ms"] - pair["prefill_ms"] for pair in pairs], 50)
    return None if median is None else round(median, 2)


def ratios(results: Results) -> list[dict[str, Any]]:
    """Gateway tokens/s over the naive server, the static batch and ``generate_batch`` at the same C;
    at C=1 also the served TTFT p50 minus the in-process prefill p50, and the median of their
    per-request differences."""
    naive_rate = results.naive["output_tokens_per_s"] if results.naive else None
    prefill_p50 = results.prefill.get("prefill_ms_p50") if results.prefill else None
    lines = []
    for concurrency, gateway in sorted(results.gateway.items()):
        rate = gateway.get("output_tokens_per_s")
        static_rate = results.static.get(concurrency, {}).get("output_tokens_per_s")
        continuous_rate = results.continuous.get(concurrency, {}).get("output_tokens_per_s")
        line = {
            "concurrency": concurrency,
            "gateway_tokens_per_s": rate,
            "vs_naive": _ratio(rate, naive_rate),
            "vs_static_batch": _ratio(rate, static_rate),
            "vs_generate_batch": _ratio(rate, continuous_rate),
        }
        if concurrency == 1:
            line["ttft_minus_prefill_ms"] = _difference(gateway.get("ttft_ms_p50"), prefill_p50)
            line["ttft_minus_prefill_ms_paired_p50"] = _paired_difference_p50(results.prefill)
        lines.append(line)
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
_GATEWAY_HEADER += ["TPOT50ms", "tok/chunk", "x naive", "x static", "x gen_batch"]


def _gateway_table(results: Results) -> list[str]:
    widths = [max(5, len(name)) for name in _GATEWAY_HEADER]
    lines = [_row(list(_GATEWAY_HEADER), widths)]
    by_c = {line["concurrency"]: line for line in ratios(results)}
    for concurrency, level in sorted(results.gateway.items()):
        keys = ["requests_sent", "errors", "truncated_requests", "output_tokens_per_s"]
        keys += ["ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "tpot_ms_p50", "tokens_per_chunk"]
        values = [concurrency, *(level.get(key) for key in keys)]
        ratio = by_c[concurrency]
        values += [ratio["vs_naive"], ratio["vs_static_batch"], ratio["vs_generate_batch"]]
        lines.append(_row(values, widths))
    return lines


def _ttft_line(results: Results) -> list[str]:
    """C=1's served TTFT against the in-process prefill, when both were measured."""
    ttft = results.gateway.get(1, {}).get("ttft_ms_p50")
    prefill = results.prefill.get("prefill_ms_p50") if results.prefill else None
    if ttft is None or prefill is None:
        return []
    how = " (measured interleaved)" if results.prefill and results.prefill.get("paired") else ""
    line = f"C=1 TTFT p50 {ttft:.1f} ms vs in-process prefill p50 {prefill:.1f} ms{how}: "
    line += f"{ttft - prefill:+.1f} ms"
    paired = _paired_difference_p50(results.prefill)
    if paired is not None:
        line += f" (median of per-request differences {paired:+.1f} ms)"
    return [line]


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
    if results.prefill:
        prefill = results.prefill
        when = ", each after its served C=1 request" if prefill.get("paired") else ""
        parts.append(
            f"in-process prefill (worker's engine, add to first token, {prefill['requests']} requests{when}):"
            f" p50 {prefill['prefill_ms_p50']} ms, {prefill['prompt_tokens_mean']} prompt tokens on average"
        )
    if results.static or results.continuous:
        parts += ["", "in-process references (same C prompts arriving together):", *_reference_table(results)]
    if results.gateway:
        parts += ["", "gateway sweep (HTTP + Redis + worker, streamed):", *_gateway_table(results)]
        parts += _ttft_line(results)
    parts += _structured_lines(results)
    return "\n".join(parts)


def _structured_lines(results: Results) -> list[str]:
    """The structured-output phase: tok/s with half the rows constrained over tok/s with none."""
    engine, served = results.structured_engine, results.structured_gateway
    if not engine and not served:
        return []
    lines = ["", "structured outputs (32 rows, every other one with a JSON schema; vs the same rows free):"]
    if engine:
        lines += [
            f"  in-process engine: {engine['half_constrained']['output_tokens_per_s']} vs "
            f"{engine['free']['output_tokens_per_s']} tok/s free (x{engine['tokens_per_s_ratio']}); "
            f"masks {engine['half_constrained']['mask_ms_per_fill']} ms per step "
            f"({engine['half_constrained']['mask_share_of_wall'] * 100:.1f} % of the time); "
            f"compile p50 {engine['compile_ms_p50']} ms, p99 {engine['compile_ms_p99']} ms",
        ]
    if served:
        ratio = served["tokens_per_s_ratio"]
        compared = "no ratio" if ratio is None else f"x{ratio}"
        lines.append(
            f"  gateway: {served['half_constrained']['output_tokens_per_s']} vs "
            f"{served['free']['output_tokens_per_s']} tok/s free ({compared}); "
            f"{served['half_constrained']['enforced_json']} of {served['constrained_requests']} "
            "constrained streams started as JSON"
        )
    return lines
