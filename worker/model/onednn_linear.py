"""Owns the CPU matmul choice: a model's ``nn.Linear`` layers run as oneDNN ops on pre-packed weights.

Why: on CPU, torch runs ``nn.Linear`` through MKL's sgemm on the weight as
stored, re-laying it out at every call; oneDNN can pack each weight once into
the blocked layout its kernels read. Measured on this 2-core AMD EPYC (AVX2),
float32: a ``[32, 576] x [576, 1536]`` matmul went from 55 to 75 GFLOP/s with
2 threads (35 to 40 with 1), and the batched engine stepping 32 sequences of
SmolLM2-135M in-process from 92 to 117 tok/s (2 threads) and 65 to 73 (1).
Decode steps of a batch are almost all matmul, so that is most of a step.

bfloat16 gains more, on a CPU that oneDNN runs bf16 on: the same shapes measured
(one thread team, this EPYC with AVX512_BF16) 63 -> 30 us at one row, 181 -> 145 us
at 32 rows, and the 49,152-wide LM head 3.0 -> 1.4 ms at one row, 7.0 -> 5.0 ms at 32.

Only exact ``nn.Linear`` modules of a float32 or bfloat16 model on CPU are swapped; other
layer kinds (quantized, LoRA, custom subclasses) are left as they are. The
packed copy replaces the layer's weight, except where the weight is shared
(an LM head tied to the embeddings), whose packed copy is extra memory.
Results can differ from MKL's in the last bits (another summation order).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


class PackedLinear(nn.Module):
    """``nn.Linear``'s forward on a weight packed once for oneDNN."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        output: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            hidden, self.packed_weight, self.bias, "none", [], ""
        )
        return output

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn_packed=True"


def can_pack(model: nn.Module) -> bool:
    """Whether this model and build allow the swap: CPU, float32 (or bfloat16 where oneDNN runs it),
    oneDNN present."""
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cpu":
        return False
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):  # type: ignore[no-untyped-call]
        return False
    if parameter.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return parameter.dtype == torch.float32


def pack_linear_layers(model: nn.Module) -> int:
    """Swap every exact ``nn.Linear`` in ``model`` for a ``PackedLinear``; returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child))
                swapped += 1
    logger.info("oneDNN packed %d Linear layers", swapped)
    return swapped
