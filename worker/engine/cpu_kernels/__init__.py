"""Owns the engine's own CPU kernels: C++ built once per machine, loaded by the worker, optional.

Why: on CPU, torch runs attention as separate products, masks and softmaxes, each a
pass over memory at a fraction of the machine's bandwidth, over every row's padded
columns; and its flash kernel spends prefill time in ``exp`` and masks rather than in
the products (docs/performance.md, "Where the eager CPU path stops"). ``attention.cpp``
fuses them: decode, one pass per row and key/value head over the row's own columns;
prefill, flash attention in register-tiled blocks, causal blocks skipped; bf16 in
bf16 dot products where the cores have AVX512_BF16, else in fp32. On this 2-core EPYC,
SmolLM2's heads, bf16: a 16-row x 1,450-column decode layer 1,925 -> 563 us (354 with
ragged rows; vLLM's own CPU kernel 753), a 512-query chunk over 1,500 past tokens
18.7 -> 8.4 ms (vLLM's 13.7); the long-prompt workload in-process 69.5 -> 102 tok/s.

``layers.cpp`` does the same for a decoder layer's elementwise work, with torch's results
bit for bit: RMSNorm in one pass per row (with the residual add where asked) and the gated
MLP's ``silu(gate) * up`` in one pass (``worker/model/kernel_layers.py``), and the rotary
embedding of queries and keys (``direct_forward.py``), where torch runs 2-14 ops each. Per
call on this EPYC, SmolLM2's widths: a norm at 1 row 15-18 -> 1.7-2 us, at 2,048 bf16 rows
1,371 -> 384 us; ``silu * up`` at 2,048 fp32 rows 10.0 -> 1.8 ms. ``step_attention.cpp``
joins a decode step's rotation, slot writes and attention in one call per layer.

Built with torch's ``cpp_extension`` (gcc and ninja) for this machine's vector ISA,
the one torch itself dispatches to (AVX-512, AVX2 or plain), into torch's extension
directory: ``make setup`` builds it (``python -m worker.engine.cpu_kernels``) so a
worker only loads it. A machine with no compiler, or a build that fails, serves
with torch's ops instead, with one log line saying so.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_DIRECTORY = Path(__file__).parent
_SOURCES = [
    _DIRECTORY / name for name in ("attention.cpp", "layers.cpp", "step_attention.cpp", "bindings.cpp")
]
_HEADERS = [_DIRECTORY / name for name in ("kernels.h", "vectors.h")]
# torch's extension loader keys its build directory by name: the source's hash in the name
# (``_name``) keeps a stale build from ever being loaded against a changed source or another ISA.
_ARCH_FLAGS = {
    "AVX512": ["-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma"],
    "AVX2": ["-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}


class CpuKernels(Protocol):
    """The built module's functions (``attention.cpp``, ``layers.cpp``, ``step_attention.cpp``)."""

    def decode_attention(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor: ...

    def prefill_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
        dots: bool = True,
    ) -> torch.Tensor: ...

    def prefill_supported(self) -> bool: ...

    def rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> list[torch.Tensor]: ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...

    def rotary(
        self, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> list[torch.Tensor]: ...

    def append_and_attend(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        heads: int,
        scale: float,
    ) -> torch.Tensor: ...


def _capability() -> str:
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def _has_avx512_bf16() -> bool:
    import torch

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return _capability() == "AVX512" and probe is not None and bool(probe())


def _flags() -> list[str]:
    # AVX512_BF16 cores (Zen 4 and later, Cooper Lake and later) get bf16 dot products.
    bf16 = ["-mavx512bf16", "-DTOKENFERRY_AVX512_BF16"] if _has_avx512_bf16() else []
    # No fused multiply-adds the source does not ask for: layers.cpp matches torch's rounding op by op.
    return ["-O3", "-fopenmp", "-ffp-contract=off", *_ARCH_FLAGS.get(_capability(), []), *bf16]


def _name() -> str:
    import torch

    # torch's version too: a build links against one torch's ABI, and two venvs share the directory.
    stamp = " ".join([*_flags(), torch.__version__]).encode()
    code = b"".join(path.read_bytes() for path in [*_SOURCES, *_HEADERS])
    digest = hashlib.sha256(code + stamp).hexdigest()[:12]
    return f"tokenferry_cpu_kernels_{digest}"


def build(verbose: bool = False) -> CpuKernels:
    """Compile (or find already compiled) and import the kernels; raises when that fails."""
    from torch.utils.cpp_extension import load

    with _ninja_on_path():
        module = load(
            name=_name(),
            sources=[str(path) for path in _SOURCES],
            extra_cflags=_flags(),
            extra_ldflags=["-fopenmp"],
            verbose=verbose,
        )
    return cast(CpuKernels, module)


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch runs ``ninja`` from PATH: the worker extra's pip package has one, in a venv not on PATH."""
    try:
        import ninja
    except ImportError:
        yield
        return
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, before])
    try:
        yield
    finally:
        os.environ["PATH"] = before


@functools.cache
def kernels() -> CpuKernels | None:
    """The built kernels, or None (logged once) where they cannot be built here."""
    try:
        return build()
    except Exception as error:
        logger.warning("CPU kernels unavailable (%s); torch's ops run in their place", error)
        return None


def describe() -> str:
    """One line naming the build: its source hash and vector ISA."""
    return f"{_name()} ({_capability()})"
