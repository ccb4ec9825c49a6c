"""Owns the output: one JSON line per measurement as it happens, then Markdown tables and a JSON file.

As ``make bench`` does (``bench/report.py``), every JSON line on stdout has ``kind``
(``peers_run``, ``peers_machine``, ``peers_level``, ``peers_error``) and ``schema``, so
lines of several runs can be concatenated and filtered with ``jq``; progress notes go to
stderr; the Markdown tables follow a blank line. ``--json-out`` writes the same lines
as one document (``{"schema", "lines"}``).

Ratios are to vLLM's own server at the same dtype and workload, measured earlier in the
same run: tok/s over vLLM's (higher is better), TTFT p50 over vLLM's (lower is better).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.peers.machine import MachineLimits

SCHEMA = 1
BASELINE = "vllm"


def emit(kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Print one JSON line and return it; its 1-minute load average above ~2 means others took CPU."""
    line = {"kind": kind, "schema": SCHEMA, **fields, "loadavg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(line), flush=True)
    return line


def note(message: str) -> None:
    print(f"bench.peers: {message}", file=sys.stderr, flush=True)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)


def vs_baseline(level: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> dict[str, float | None]:
    """A level's tok/s and TTFT p50 as ratios to the baseline's same level (None without one)."""
    if baseline is None:
        return {"vs_vllm_tokens_per_s": None, "vs_vllm_ttft_p50": None}
    return {
        "vs_vllm_tokens_per_s": _ratio(level.get("output_tokens_per_s"), baseline.get("output_tokens_per_s")),
        "vs_vllm_ttft_p50": _ratio(level.get("ttft_ms_p50"), baseline.get("ttft_ms_p50")),
    }


def level_key(line: Mapping[str, Any]) -> tuple[str, str, int]:
    """What a level is compared across systems by: dtype, workload and concurrency."""
    return (str(line["dtype"]), str(line["workload"]), int(line["concurrency"]))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) < 10:
            return f"{value:.2f}"
        return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f} %"


_LEVEL_HEADER = (
    "system", "dtype", "workload", "tok/s", "x vLLM", "TTFT p50 ms", "TTFT p99 ms", "TTFT x vLLM",
    "TPOT p50 ms", "TPOT p99 ms", "GFLOP/s", "of linear", "weights GB/s", "of copy", "loop",
    "engine MB", "errors",
)  # fmt: skip


def _workload(line: Mapping[str, Any]) -> str:
    name = "long" if line["workload"] == "long" else "chat"
    return f"{name} c={line['concurrency']}" + (" (cut)" if line.get("partial") else "")


def _level_row(line: Mapping[str, Any]) -> list[str]:
    keys = ("output_tokens_per_s", "vs_vllm_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "vs_vllm_ttft_p50")
    keys2 = ("tpot_ms_p50", "tpot_ms_p99", "model_gflops")
    return [
        line["system"], line["dtype"], _workload(line), *(_cell(line.get(key)) for key in keys),
        *(_cell(line.get(key)) for key in keys2), _percent(line.get("share_of_linear")),
        _cell(line.get("weights_gb_s")), _percent(line.get("share_of_copy")),
        _loop_percent(line.get("loop_share")), _cell(line.get("engine_rss_peak_mb")),
        _cell(line.get("errors")),
    ]  # fmt: skip


def _loop_percent(value: float | None) -> str:
    """The worker loop's share (``loop_time.py``): a tenth of a percent, as 5 % is its target."""
    return "-" if value is None else f"{value * 100:.1f} %"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def levels_table(lines: Sequence[Mapping[str, Any]]) -> list[str]:
    """One Markdown row per measured level and per system that failed, in the order they ran."""
    rows = []
    for line in lines:
        if line["kind"] == "peers_level":
            rows.append(_level_row(line))
        elif line["kind"] == "peers_error":
            first = str(line["error"]).splitlines()[0] if line["error"] else ""
            rows.append([line["system"], line["dtype"], f"failed: {first[:120]}", *["-"] * 14])
    return _markdown(_LEVEL_HEADER, rows)


def machine_table(limits: MachineLimits) -> list[str]:
    rows = [
        [limit.dtype, str(limit.rows), _cell(limit.plain_gflops), _cell(limit.packed_gflops)]
        for limit in limits.linear
    ]
    header = ("linear 576->1536", "rows", "F.linear GFLOP/s", "oneDNN packed GFLOP/s")
    lines = _markdown(header, rows)
    return [*lines, "", f"memory copy: {limits.copy_gb_s} GB/s (read + write), {limits.threads} threads"]


def summary(lines: Sequence[Mapping[str, Any]], limits: MachineLimits | None, parameters: int) -> str:
    """The Markdown printed after the JSON lines."""
    parts = ["", "## tokenferry against vLLM's CPU server (one run; noisy if the load average was high)", ""]
    if limits is not None:
        gflop = 2 * parameters / 1e9
        parts += [
            f"Machine limits ({limits.threads} threads; the model costs {gflop:.3f} GFLOP per token):",
            "",
        ]
        parts += [*machine_table(limits), ""]
    parts += levels_table(lines)
    return "\n".join(parts)


def write_document(path: Path, lines: Sequence[Mapping[str, Any]]) -> None:
    path.write_text(json.dumps({"schema": SCHEMA, "lines": list(lines)}, indent=1) + "\n")
