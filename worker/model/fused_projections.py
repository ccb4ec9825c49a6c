"""Owns fused input projections: a layer's q/k/v (and gate/up) Linears run as one wider matmul.

Decoder layers call ``q_proj``, ``k_proj`` and ``v_proj`` on the same hidden states, and
the MLP ``gate_proj`` and ``up_proj``; five matmuls where two would do, each reading the
input again and paying its own call. vLLM and SGLang fuse them in their own model code
(``QKVParallelLinear``, ``MergedColumnParallelLinear``). transformers' model code calls
the five modules by name, so here each group's weights are concatenated into one
``nn.Linear`` (``FusedGroup``), and the five modules become ``ProjectionSlice``s of it:
the first slice called on a tensor computes the whole product, the others called on
that same tensor object read their columns of it. Any model keeps its own forward.

Measured on this 2-core EPYC (AVX512_BF16), oneDNN-packed (``onednn_linear.py``),
SmolLM2-135M's shapes, the five projections of one layer separate against fused:
bf16 135 -> 89 us at one row, 288 -> 232 at 16, 459 -> 403 at 32, 776 -> 732 at 64;
fp32 180 -> 123 at one row, 469 -> 403 at 16, 825 -> 765 at 32, and 1,488 -> 1,547 at
64 (slower alone). Whole decode steps in the engine, the median of 64: bf16 27.5 -> 26.5 ms
at one row, 34 -> 33 at 8, 61 -> 57 at 32; fp32 38.3 -> 36.2, 44.2 -> 42.4, 88.1 -> 84.7,
and 146 -> 139 at 64 rows (the input read once, one call instead of five).

What is fused: groups of exact ``nn.Linear`` siblings of one module, the same input
width, dtype and device, all with a bias or none. A slice returns a view of the fused
output (its columns): the model code that follows (``view``, ``transpose``, rotary,
the cache) reads views as it reads tensors. Not under ``torch.compile`` (``--compile``
keeps separate Linears: a compiled graph would not reuse a product across calls).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

# Sibling Linears fused into one, by attribute name (Llama, Mistral, Qwen2/3, Gemma, ...), and the
# name the fused group takes on their module.
GROUPS = {"qkv_fused": ("q_proj", "k_proj", "v_proj"), "gate_up_fused": ("gate_proj", "up_proj")}


class FusedGroup(nn.Module):
    """One Linear over a group's concatenated weights, and its input's output until every slice read it."""

    def __init__(self, linear: nn.Linear, slices: int) -> None:
        super().__init__()
        self.linear = linear
        self._slices = slices
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._unread = 0

    def output(self, hidden: torch.Tensor) -> torch.Tensor:
        """The fused product of ``hidden``: computed once for the slices called on that tensor."""
        if self._input is not hidden or self._output is None:
            output: torch.Tensor = self.linear(hidden)
            self._input, self._output, self._unread = hidden, output, self._slices
        else:
            output = self._output
        self._unread -= 1
        if self._unread <= 0:
            # Every slice has its columns: hold nothing between forwards (a prefill's product of
            # every layer would stay alive otherwise, ~150 MB for 512 tokens of SmolLM2 in bf16).
            self._input = self._output = None
        return output


class ProjectionSlice(nn.Module):
    """What one of the group's Linears returned: columns ``start:stop`` of the fused product."""

    group: FusedGroup

    def __init__(self, group: FusedGroup, start: int, stop: int, in_features: int) -> None:
        super().__init__()
        # A plain attribute, not a submodule: the group is registered once, on the parent.
        object.__setattr__(self, "group", group)
        self.start, self.stop = start, stop
        self.in_features, self.out_features = in_features, stop - start

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.group.output(hidden)[..., self.start : self.stop]

    def extra_repr(self) -> str:
        columns = f"{self.start}:{self.stop}"
        return f"in_features={self.in_features}, out_features={self.out_features}, fused_columns={columns}"


def fuse_projections(model: nn.Module) -> int:
    """Fuse every group of ``GROUPS`` that ``model``'s modules hold as plain Linears; how many."""
    fused = 0
    for parent in list(model.modules()):
        for group_name, names in GROUPS.items():
            linears = [getattr(parent, name, None) for name in names]
            if _fusable(linears):
                _fuse(parent, group_name, names, linears)  # type: ignore[arg-type]
                fused += 1
    logger.info("fused %d groups of input projections", fused)
    return fused


def _fusable(linears: list[object]) -> bool:
    if not all(type(linear) is nn.Linear for linear in linears):
        return False
    first: nn.Linear = linears[0]  # type: ignore[assignment]
    return all(
        linear.in_features == first.in_features  # type: ignore[attr-defined]
        and linear.weight.dtype == first.weight.dtype  # type: ignore[attr-defined]
        and linear.weight.device == first.weight.device  # type: ignore[attr-defined]
        and (linear.bias is None) == (first.bias is None)  # type: ignore[attr-defined]
        for linear in linears
    )


def _fuse(parent: nn.Module, group_name: str, names: tuple[str, ...], linears: list[nn.Linear]) -> None:
    first = linears[0]
    widths = [linear.out_features for linear in linears]
    linear = nn.Linear(
        first.in_features,
        sum(widths),
        bias=first.bias is not None,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        linear.weight.copy_(torch.cat([part.weight for part in linears]))
        if linear.bias is not None:
            linear.bias.copy_(torch.cat([part.bias for part in linears]))
    linear.weight.requires_grad_(False)
    group = FusedGroup(linear, slices=len(linears))
    parent.add_module(group_name, group)
    start = 0
    for name, width in zip(names, widths, strict=True):
        setattr(parent, name, ProjectionSlice(group, start, start + width, first.in_features))
        start += width
