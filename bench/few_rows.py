"""Owns the few-row product prototype: fp32 ``x @ W.T`` for a decode step's 1-16 rows, against oneDNN.

At 16 rows oneDNN's packed product reads this machine's weights at 12-16 GB/s, half
of what two threads read (docs/performance.md, "Where the served long prompts lose
against in-process"): bound neither by memory nor by the cores. This prototype is
the kernel shape that measured faster, kept so the next step starts from numbers:
weights in panels of 16 output columns (``[N / 16, K, 16]``), two panels at a time,
eight rows' sums in registers; with 16 rows, K in blocks of 128 so the second eight
rows read the block from L1. It is not used by the engine: its panels would be a
second copy of every weight beside oneDNN's, and measured again at 8-64 rows, neither these
panels nor a [K, N] layout beat oneDNN on every shape (docs/performance.md, "The relays' CPU
per request ...").

Each weight shape is measured with enough distinct weights (~400 MB) that none is in
cache, as a decode step's 30 layers are not; timed as bench-peers times the machine's
limits (``seconds_per_call``: the best of repeated means), in one process.
Run: ``HF_HUB_OFFLINE=1 .venv/bin/python -m bench.few_rows`` (compiles ~1 min).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.peers.machine import packed_call, seconds_per_call

# SmolLM2-135M's (K, N): fused QKV, fused gate/up, down, the head.
SHAPES = ((576, 960), (576, 3072), (1536, 576), (576, 49152))
ROWS = (1, 8, 16)
RESIDENT_BYTES = 400e6

KERNEL = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>

// Rows [0, M) (M <= 8) times the panel pair at ``p`` over K columns [k0, k1); ``first`` starts the sums.
template <int M>
void pair(const float* x, int64_t K, const float* w, float* y, int64_t N, int64_t p, int64_t k0, int64_t k1,
          bool first) {
  const float* w0 = w + p * K * 16;
  const float* w1 = w0 + K * 16;
  __m512 a0[M], a1[M];
  for (int m = 0; m < M; ++m) {
    a0[m] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + m * N + p * 16);
    a1[m] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + m * N + p * 16 + 16);
  }
  for (int64_t k = k0; k < k1; ++k) {
    const __m512 v0 = _mm512_load_ps(w0 + k * 16), v1 = _mm512_load_ps(w1 + k * 16);
    for (int m = 0; m < M; ++m) {
      const __m512 b = _mm512_set1_ps(x[m * K + k]);
      a0[m] = _mm512_fmadd_ps(b, v0, a0[m]);
      a1[m] = _mm512_fmadd_ps(b, v1, a1[m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    _mm512_storeu_ps(y + m * N + p * 16, a0[m]);
    _mm512_storeu_ps(y + m * N + p * 16 + 16, a1[m]);
  }
}

at::Tensor few_rows(at::Tensor x, at::Tensor panels) {
  const int64_t M = x.size(0), K = x.size(1), P = panels.size(0), N = P * 16;
  TORCH_CHECK(M == 1 || M == 8 || M == 16, "rows: 1, 8 or 16");
  TORCH_CHECK(P % 2 == 0, "an even number of panels");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = panels.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t block = M == 16 ? 128 : K;  // 16 rows: the second eight read the block from L1
  at::parallel_for(0, P / 2, 4, [&](int64_t a, int64_t b) {
    for (int64_t p = 2 * a; p < 2 * b; p += 2) {
      for (int64_t k0 = 0; k0 < K; k0 += block) {
        const int64_t k1 = std::min(K, k0 + block);
        for (int64_t h = 0; h < M; h += 8) {
          if (M == 1) pair<1>(xp, K, wp, yp, N, p, k0, k1, k0 == 0);
          else pair<8>(xp + h * K, K, wp, yp + h * N, N, p, k0, k1, k0 == 0);
        }
      }
    }
  });
  return y;
}
"""


def _compiled() -> Any:
    from torch.utils.cpp_extension import load_inline

    build = Path.home() / ".cache" / "tokenferry" / "few_rows"
    build.mkdir(parents=True, exist_ok=True)
    return load_inline(
        "tokenferry_few_rows_v2",
        cpp_sources=KERNEL,
        functions=["few_rows"],
        extra_cflags=["-O3", "-march=native", "-fopenmp"],  # at::parallel_for needs OpenMP here
        extra_ldflags=["-fopenmp"],
        build_directory=str(build),
    )


def _cycling(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One call after another over distinct weights, so each reads its weight from memory."""
    turns = itertools.cycle(calls)
    return lambda: next(turns)()


def main() -> None:
    kernel = _compiled()
    torch.manual_seed(0)
    print("| weight (K x N) | rows | oneDNN packed us | few-row kernel us | speed-up |")
    print("| --- | --- | --- | --- | --- |")
    for k, n in SHAPES:
        copies = max(1, int(RESIDENT_BYTES // (k * n * 4)))
        weights = [torch.randn(n, k) for _ in range(copies)]
        panels = [weight.view(n // 16, 16, k).transpose(1, 2).contiguous() for weight in weights]
        for rows in ROWS:
            x = torch.randn(rows, k)
            got = kernel.few_rows(x, panels[0])
            torch.testing.assert_close(got, torch.nn.functional.linear(x, weights[0]), atol=1e-3, rtol=1e-4)
            onednn_calls = [packed_call(x, weight) for weight in weights]
            if any(call is None for call in onednn_calls):
                raise SystemExit("this torch build has no oneDNN packed products to compare with")
            onednn = seconds_per_call(_cycling([call for call in onednn_calls if call is not None]))
            few = seconds_per_call(_cycling([lambda x=x, p=p: kernel.few_rows(x, p) for p in panels]))
            print(f"| {k} x {n} | {rows} | {onednn * 1e6:.0f} | {few * 1e6:.0f} | {onednn / few:.2f} |")


if __name__ == "__main__":
    main()
