"""Owns the decoder layers' elementwise work in the CPU kernels: a model's RMSNorms and gated MLPs
swapped for modules that run ``cpu_kernels/layers.cpp``.

Why: torch runs a Llama RMSNorm as 8 ops (widen, square, mean, add, rsqrt, multiply,
narrow, multiply) and the MLP's ``act(gate) * up`` as 2 over a strided view, each a pass
over memory and a dispatch. Per call on this 2-core EPYC, SmolLM2's widths: a norm
15-18 -> 1.7-2 us at 1 row and 20-28 -> 7-11 us at 32 (61 norms a step); at 2,048 rows
(a prefill chunk) bf16 norms 1,371 -> 384 us, and fp32 ``silu * up`` 10.0 -> 1.8 ms (30 a
chunk). vLLM and SGLang fuse the same work in their CPU kernels.

What is swapped: exact RMSNorm modules of ``RMS_NORMS`` (Llama's formula: fp32 statistics,
the normalized row rounded to the model's dtype, then the weight) and exact MLP modules of
``GATED_MLPS`` whose activation is SiLU and whose gate/up Linears were fused
(``fused_projections.py``). Eager CPU models only: ``--compile`` traces torch's ops, and
where the kernels cannot be built the modules stay as they are.

Numerics: bit for bit transformers' modules (tested). ``silu * up`` is torch's own
expression (at::vec's exp); a norm's sum of squares adds in the order torch's CPU sum kernel
adds a row (``layers.cpp``), so a model's greedy text does not move when its norms run here:
a first version with 16-lane sums differed in one ulp in a quarter of the rows, and a bf16
SmolLM2's story parted from the stock model's after about 40 tokens. Both of a worker's
paths, the model's forward and the direct forward (``direct_forward.py``), run the same
swapped modules.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from worker.engine.cpu_kernels import CpuKernels

logger = logging.getLogger(__name__)

RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
GATED_MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")
# What the kernels are built for.
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class KernelRMSNorm(nn.Module):
    """An RMSNorm of Llama's formula in one pass per row; ``add_forward`` adds the residual first."""

    weight: nn.Parameter

    def __init__(self, norm: Any, kernels: CpuKernels) -> None:
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = float(norm.variance_epsilon)
        self._kernels = kernels
        # The module's own forward (a bound method, not a submodule), for inputs the kernel does not take.
        self._module_forward = norm.forward

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.dtype != self.weight.dtype or hidden.stride(-1) != 1:  # promotions, odd layouts: torch's
            return self._module_forward(hidden)  # type: ignore[no-any-return]
        return self._kernels.rms_norm(hidden, None, self.weight, self.variance_epsilon)[0]

    def add_forward(self, delta: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + delta), residual + delta)``: a decoder's residual add and the next norm."""
        fits = delta.shape == residual.shape and delta.dtype == residual.dtype == self.weight.dtype
        if not fits or delta.stride(-1) != 1 or residual.stride(-1) != 1:
            total = residual + delta
            return self.forward(total), total
        normed, total = self._kernels.rms_norm(delta, residual, self.weight, self.variance_epsilon)
        return normed, total

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, cpu_kernel=True"


class KernelGatedMLP(nn.Module):
    """``down(silu(gate) * up)`` on the fused gate/up product, the activation and product in one pass."""

    def __init__(self, mlp: Any, kernels: CpuKernels) -> None:
        super().__init__()
        self.gate_up = mlp.gate_up_fused.linear
        self.down_proj = mlp.down_proj
        self._kernels = kernels

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        output: torch.Tensor = self.down_proj(self._kernels.silu_and_mul(self.gate_up(hidden)))
        return output


def use_kernel_layers(model: nn.Module, kernels: CpuKernels | None) -> int:
    """Swap ``model``'s norms and gated MLPs for kernel ones where it qualifies; how many were."""
    parameter = next(model.parameters(), None)
    if (
        kernels is None
        or parameter is None
        or parameter.device.type != "cpu"
        or parameter.dtype not in _DTYPES
    ):
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            replacement = _kernel_module(child, kernels)
            if replacement is not None:
                setattr(parent, name, replacement)
                swapped += 1
    logger.info("%d norms and MLPs run in the CPU kernels", swapped)
    return swapped


def _kernel_module(module: Any, kernels: CpuKernels) -> nn.Module | None:
    kind = type(module)
    if not kind.__module__.startswith("transformers.models."):
        return None
    if kind.__name__ in RMS_NORMS and module.weight.dim() == 1 and module.weight.is_contiguous():
        return KernelRMSNorm(module, kernels)
    if kind.__name__ in GATED_MLPS and _gated_silu(module):
        return KernelGatedMLP(module, kernels)
    return None


def _gated_silu(mlp: Any) -> bool:
    """Whether ``mlp`` computes ``down(silu(gate) * up)`` from a fused gate/up product."""
    from transformers.activations import SiLUActivation

    activation = mlp.act_fn
    silu = isinstance(activation, nn.SiLU | SiLUActivation) or activation is nn.functional.silu
    group = getattr(mlp, "gate_up_fused", None)
    return silu and group is not None and group.linear.out_features == 2 * mlp.down_proj.in_features
