"""Owns what a system's throughput means against the machine's limits: model GFLOP/s and weight bandwidth.

- Model GFLOP/s = tok/s x 2 x parameters / 1e9 (SmolLM2-135M: ~0.27 GFLOP per token; the
  tied LM head counted once, as the matmul it is; the long workload counts its prompt tokens
  as well as its output tokens, an upper bound since the LM head runs only on the last
  prompt position), against the best linear-layer GFLOP/s
  at the measured row count nearest the level's concurrency (a decode step has C rows);
  the long-prompt workload, prefill-bound, against the largest row count.
- Weight GB/s = decode steps/s x the weights' bytes, with steps/s = tok/s / C (each step
  of a full batch yields C tokens), against the copy bandwidth: how close the one-stream
  levels come to streaming the weights at memory speed. Not given for the long workload,
  whose steps are mostly prefill.
Both ignore attention and everything else outside the matmuls: upper bounds, not profiles.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from bench.peers.machine import MachineLimits

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def parameter_count(model_dir: Path) -> int:
    """Parameters in the directory's safetensors files, read from their headers (no weights loaded)."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header: dict[str, Any] = json.loads(handle.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for size in entry["shape"]:
                    count *= size
                total += count
    return total


def _share(value: float | None, limit: float | None) -> float | None:
    return None if value is None or not limit else round(value / limit, 3)


def machine_shares(
    tokens_per_s: float | None,
    *,
    computed_tokens_per_s: float | None = None,
    concurrency: int,
    dtype: str,
    parameters: int,
    limits: MachineLimits,
    prefill_bound: bool = False,
) -> dict[str, float | None]:
    """A level's model GFLOP/s and weight GB/s, and each as a share of the machine's limit.

    ``computed_tokens_per_s`` (prompt plus output tokens per second) replaces ``tokens_per_s``
    in the GFLOP/s where prompts are a large part of the work.
    """
    if not tokens_per_s:
        return {"model_gflops": None, "share_of_linear": None, "weights_gb_s": None, "share_of_copy": None}
    gflops = (computed_tokens_per_s or tokens_per_s) * 2 * parameters / 1e9
    rows = max(limit.rows for limit in limits.linear) if prefill_bound else concurrency
    weights_gb_s = None
    if not prefill_bound:
        weights_gb_s = round(tokens_per_s / concurrency * parameters * DTYPE_BYTES.get(dtype, 4) / 1e9, 1)
    return {
        "model_gflops": round(gflops, 1),
        "share_of_linear": _share(gflops, limits.linear_gflops(dtype, rows)),
        "weights_gb_s": weights_gb_s,
        "share_of_copy": _share(weights_gb_s, limits.copy_gb_s),
    }
