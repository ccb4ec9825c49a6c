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

Wide bf16 products in fp32, where this machine runs them faster. On a 2-core Intel Xeon
with AVX512_BF16 and no AMX exposed, oneDNN's packed bf16 products ran at 155-172 GFLOP/s
from 32 to 1,800 rows while fp32 ran at 218-304 (SmolLM2's four layer shapes, 2 threads): a
1,850-token bf16 prefill spent 2.4 of its 3.2 s in Linears. There, an input of many rows (a
prefill) widens to fp32 and multiplies the packed weight's fp32 copy, made for that call
(``to_dense``: about 1.5 ms a layer of SmolLM2) and dropped after it: at 1,024 rows 42.4 ->
25.1 ms a layer, at 128 rows 5.4 -> 4.1. The products are the same (bf16 x bf16 is exact in
fp32, and both sum in fp32); the output is rounded to bf16 as before. Decode steps' few rows
stay in bf16, which reads half the bytes. Where the fp32 route pays, and from how many rows,
is measured at packing time (``wide_rows``: about 0.3 s, on the model's most common layer
shape): on an EPYC or an AMX core bf16 is the faster and nothing changes. Nothing is kept:
the weights' memory is the packed bf16 copy alone.

Each call's row count is a primitive of its own to oneDNN, which caches it, and so does torch's
ideep layer above it: 1,024 of each by default, each holding ~0.6 MB at decode sizes and up to
~4 MB at a 2,048-row prefill's. Decode steps reuse a few row counts; prefills, whose token counts
vary with the prompts, add new ones at every step. One bf16 layer shape fed 2,048 row counts grew
the process by 1.7 GB here, and a worker serving 192 requests of mixed lengths at c=64 peaked
107 MB higher than with 64 entries per cache, and ran no faster (a row count not cached costs
~1 ms to create, once per layer shape and step: the model's layers share their shapes).
``bound_primitive_caches`` therefore caps both at ``PRIMITIVE_CACHE_ENTRIES``.

Only exact ``nn.Linear`` modules of a float32 or bfloat16 model on CPU are swapped; other
layer kinds (quantized, LoRA, custom subclasses) are left as they are. The
packed copy replaces the layer's weight, except where the weight is shared
(an LM head tied to the embeddings), whose packed copy is extra memory.
Results can differ from MKL's in the last bits (another summation order).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from functools import partial

import torch
from torch import nn

from worker.engine.cpu_kernels.choices import median_seconds

logger = logging.getLogger(__name__)

# The row counts tried for the fp32 route of bf16 products, and how much faster it must measure.
WIDE_ROWS_TRIED = (128, 256, 512)
WIDE_MARGIN = 1.1


# Entries of oneDNN's primitive cache and of ideep's above it: a few decode row counts for each of a
# model's ~5 layer shapes, and the latest prefills'. 32 measured ~3 % slower at c=64 (decode row
# counts evicted); 64 and 1,024 ran alike.
PRIMITIVE_CACHE_ENTRIES = 64
_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_primitive_caches() -> None:
    """Cap oneDNN's and ideep's primitive caches (see the module docstring), unless the environment
    sets them. Both read their capacity when first used: call it before the process's first oneDNN op."""
    for variable in _CACHE_VARIABLES:
        os.environ.setdefault(variable, str(PRIMITIVE_CACHE_ENTRIES))


class PackedLinear(nn.Module):
    """``nn.Linear``'s forward on a weight packed once for oneDNN; inputs of ``wide_rows`` rows or
    more (when set) multiply in fp32 (see the module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias
        self.wide_rows: int | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.wide_rows is not None and hidden.numel() >= self.wide_rows * self.in_features:
            return self.forward_in_fp32(hidden)
        return self.forward_packed(hidden)

    def forward_packed(self, hidden: torch.Tensor) -> torch.Tensor:
        output: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            hidden, self.packed_weight, self.bias, "none", [], ""
        )
        return output

    def forward_in_fp32(self, hidden: torch.Tensor) -> torch.Tensor:
        """The product in fp32 on a copy of the weight made for this call, rounded to ``hidden``'s dtype."""
        weight = self.packed_weight.to_dense(torch.float32)
        bias = None if self.bias is None else self.bias.float()
        return nn.functional.linear(hidden.float(), weight, bias).to(hidden.dtype)

    def extra_repr(self) -> str:
        wide = "" if self.wide_rows is None else f", fp32_from_rows={self.wide_rows}"
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn_packed=True{wide}"


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
    packed = [module for module in model.modules() if isinstance(module, PackedLinear)]
    if packed and packed[0].packed_weight.dtype == torch.bfloat16:
        rows = wide_rows(_most_common_shape(packed))
        for module in packed:
            module.wide_rows = rows
    return swapped


def wide_rows(layer: PackedLinear) -> int | None:
    """The fewest rows (of ``WIDE_ROWS_TRIED``) from which ``layer``'s bf16 product runs faster in
    fp32 on this machine, by ``WIDE_MARGIN`` at least there and at every larger count; None when it
    never does."""
    generator = torch.Generator().manual_seed(0)
    faster: list[int] = []
    with torch.inference_mode():
        for rows in WIDE_ROWS_TRIED:
            hidden = torch.randn(rows, layer.in_features, generator=generator).to(torch.bfloat16)
            packed = median_seconds(partial(layer.forward_packed, hidden))
            in_fp32 = median_seconds(partial(layer.forward_in_fp32, hidden))
            logger.debug("bf16 product, %d rows: packed %.5f s, fp32 %.5f s", rows, packed, in_fp32)
            faster.append(rows if in_fp32 * WIDE_MARGIN < packed else 0)
    chosen = next((rows for index, rows in enumerate(faster) if rows and all(faster[index:])), None)
    if chosen is None:
        logger.info("bf16 products stay in bf16 at every width (measured faster here)")
    else:
        logger.info("bf16 products of %d rows or more multiply in fp32 (measured faster here)", chosen)
    return chosen


def _most_common_shape(layers: list[PackedLinear]) -> PackedLinear:
    """A layer of the shape most layers have (the largest of those): a decoder layer's, not the head's."""
    shapes = Counter((layer.in_features, layer.out_features) for layer in layers)
    shape = max(shapes, key=lambda pair: (shapes[pair], pair[0] * pair[1]))
    return next(layer for layer in layers if (layer.in_features, layer.out_features) == shape)
