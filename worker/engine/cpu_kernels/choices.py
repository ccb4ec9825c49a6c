"""Owns the kernel variants chosen by timing them on this machine: measured once per process.

Why measured, not read from the CPU flags: the same instruction set runs at different speeds
on the two CPU types the project gets. bf16 prefill attention in bf16 dot products
(``vdpbf16ps``) was 1.45x the fp32 FMAs on a 2-core AMD EPYC (docs/performance.md), and 0.67x
on a 2-core Intel Xeon with AVX512_BF16 and no AMX exposed: one 1,850-token prefill step of
SmolLM2-135M in bf16 spent 532 ms in the kernel with dot products, 355 ms with the keys and
values widened to fp32 (torch.profiler, the kernel timed apart).

The measurement runs the variants on a prefill of SmolLM2's head shape (256 queries over 512
keys, 9 query and 3 key/value heads of 64), median of 5 each, at the first bf16 prefill (a
worker's warm-up, before it reports ready): about 50 ms. The dot products stay unless the fp32
FMAs are clearly faster (``MARGIN``), so a noisy measurement keeps the variant the kernel
was written for. Both give sdpa's outputs to bf16's rounding (``tests/unit/test_cpu_kernels.py``);
the fp32 FMAs are the more exact.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from worker.engine.cpu_kernels import CpuKernels

logger = logging.getLogger(__name__)

# How much faster the fp32 FMAs must measure to replace the dot products.
MARGIN = 1.1
_REPEATS = 5


class _Chosen:
    bf16_dots: bool | None = None


def bf16_dot_products(kernels: CpuKernels) -> bool:
    """Whether bf16 prefill attention runs in bf16 dot products here (measured at the first call)."""
    if _Chosen.bf16_dots is None:
        _Chosen.bf16_dots = _measure_bf16_dots(kernels)
    return _Chosen.bf16_dots


def _measure_bf16_dots(kernels: CpuKernels) -> bool:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 9, 256, 64, generator=generator).to(torch.bfloat16)
    key, value = (torch.randn(1, 3, 512, 64, generator=generator).to(torch.bfloat16) for _ in range(2))
    with torch.inference_mode():
        dots = median_seconds(lambda: kernels.prefill_attention(query, key, value, None, 0.125, True))
        fp32 = median_seconds(lambda: kernels.prefill_attention(query, key, value, None, 0.125, False))
    chosen = fp32 * MARGIN >= dots
    logger.info(
        "bf16 prefill attention in %s (measured: bf16 dot products %.2f ms, fp32 FMAs %.2f ms)",
        "bf16 dot products" if chosen else "fp32 FMAs",
        dots * 1e3,
        fp32 * 1e3,
    )
    return chosen


def median_seconds(run: Callable[[], object]) -> float:
    """``run``'s median time of ``_REPEATS`` calls, after one untimed call (also ``onednn_linear``'s)."""
    run()  # first touch of the buffers, outside the timing
    times = []
    for _ in range(_REPEATS):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return sorted(times)[_REPEATS // 2]
