"""Owns the machine's measured limits: linear-layer GFLOP/s at fp32 and bf16, and memory copy bandwidth.

Measured in this process before any system starts, with ``THREADS`` torch threads (the
cores every system gets). The linear layer has SmolLM2-135M's MLP shape (576 -> 1536) at
32 rows (a decode step of 32 sequences) and 256 (a prefill chunk), through plain
``F.linear`` and through oneDNN on a weight packed once (``torch.ops.mkldnn``, as
``worker/model/onednn_linear.py`` runs it); either can be the faster on a given CPU
(DESIGN.md: the EPYC favours packed, an AMX Xeon plain bf16), so both are kept and the
limit is the better. Copy bandwidth counts bytes read plus bytes written, as STREAM's
Copy does, of a 256 MiB float32 tensor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

THREADS = 2
IN_FEATURES, OUT_FEATURES = 576, 1536
ROWS = (32, 256)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
COPY_ELEMENTS = 64 * 1024 * 1024  # 256 MiB of float32: far past any cache
REPEATS = 5
MIN_SECONDS = 0.2  # per repeat


@dataclass(frozen=True)
class LinearLimit:
    dtype: str
    rows: int
    plain_gflops: float
    packed_gflops: float | None  # None where this torch build cannot pack for that dtype

    @property
    def best_gflops(self) -> float:
        return max(self.plain_gflops, self.packed_gflops or 0.0)


@dataclass(frozen=True)
class MachineLimits:
    threads: int
    linear: tuple[LinearLimit, ...]
    copy_gb_s: float

    def linear_gflops(self, dtype: str, rows: int) -> float | None:
        """The best linear GFLOP/s at ``dtype`` and the measured row count nearest ``rows`` (log scale)."""
        candidates = [limit for limit in self.linear if limit.dtype == dtype]
        if not candidates:
            return None
        nearest = min(candidates, key=lambda limit: abs(math.log2(limit.rows / rows)))
        return nearest.best_gflops


def seconds_per_call(call: Callable[[], object]) -> float:
    """The best over REPEATS of the mean time per call, each repeat running at least MIN_SECONDS.

    The best, not the median: a limit is what the machine can do, and on a shared machine
    another process's burst only ever makes a repeat slower.
    """
    for _ in range(3):
        call()  # oneDNN builds its primitive on the first call
    means = []
    for _ in range(REPEATS):
        calls, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < MIN_SECONDS:
            call()
            calls += 1
        means.append(elapsed / calls)
    return min(means)


def packed_call(hidden: torch.Tensor, weight: torch.Tensor) -> Callable[[], object] | None:
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        torch.ops.mkldnn._linear_pointwise(hidden, packed, None, "none", [], "")
    except (RuntimeError, AttributeError):
        return None
    return lambda: torch.ops.mkldnn._linear_pointwise(hidden, packed, None, "none", [], "")


def measure_linear(dtype: str, rows: int) -> LinearLimit:
    kind = DTYPES[dtype]
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, IN_FEATURES, generator=generator).to(kind)
    weight = torch.randn(OUT_FEATURES, IN_FEATURES, generator=generator).to(kind)
    gflop = 2 * rows * IN_FEATURES * OUT_FEATURES / 1e9
    with torch.inference_mode():
        plain = gflop / seconds_per_call(lambda: F.linear(hidden, weight))
        call = packed_call(hidden, weight)
        packed = gflop / seconds_per_call(call) if call else None
    return LinearLimit(dtype, rows, round(plain, 1), None if packed is None else round(packed, 1))


def measure_copy_gb_s() -> float:
    source = torch.ones(COPY_ELEMENTS, dtype=torch.float32)
    target = torch.empty_like(source)
    seconds = seconds_per_call(lambda: target.copy_(source))
    return round(2 * source.nbytes / seconds / 1e9, 1)


def measure_limits(dtypes: tuple[str, ...] = tuple(DTYPES)) -> MachineLimits:
    """Every limit, with THREADS torch threads (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        linear = tuple(measure_linear(dtype, rows) for dtype in dtypes for rows in ROWS)
        return MachineLimits(THREADS, linear, measure_copy_gb_s())
    finally:
        torch.set_num_threads(threads)
