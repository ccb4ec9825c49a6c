"""Owns attention for the batched engine's models: one query token per row as two batched matmuls,
or on CPU in the fused kernels (``cpu_kernels``).

Two names are registered: ``ATTENTION_NAME`` (the matmuls below; GPUs, compiled steps, and CPUs
where the kernel is off or cannot be built) and ``KERNEL_ATTENTION_NAME``, whose eager CPU
forwards go to ``cpu_kernels/attention.cpp``: decode steps, and prefill chunks with a boolean
mask or none on a causal layer (head_dim 64 or 128). In bf16 the kernels are 3.6-12x the
matmuls in decode and 2.1-3.6x sdpa in prefill here (docs/performance.md has the tables); the
rest of this docstring is about the matmuls.

Registered with transformers' ``AttentionInterface`` (and its mask interface, as
sdpa's) under ``ATTENTION_NAME``, and selected on the model at load when its layers
are plain full attention (``use_decode_attention``): every forward but a decode step
goes to transformers' own sdpa unchanged. A decode step (one query token per row,
the slot cache's boolean mask, no softcap, no sinks, no sliding window) computes, per
key/value head, the grouped query heads' scores against the row's columns, masks
each row past its length, softmaxes in float32 and weights the values: grouped-query
attention without repeating keys and values.

Why: torch's CPU sdpa runs a one-token query badly. Measured on this 2-core EPYC,
32 rows x 150 columns, 9 query and 3 key/value heads of 64: sdpa as transformers calls
it 2,565 us per layer in bf16 and 1,215 us in fp32; this 435 and 346 us; at 600 columns
11,556 against 2,306 us in bf16 and 30,188 against 1,661 us in fp32 (sdpa after
``repeat_kv``). On SmolLM2-135M's 30 layers that was a third of a bf16 decode step.
Scores agree with sdpa's to bf16's rounding (4e-3) and fp32's (5e-7). One choice for
every batch size in fp32 on purpose: fp32 sdpa without ``repeat_kv`` beats this below 8
rows (1 x 100: 22 against 41 us, about 0.6 ms of a 30-layer step), but switching
algorithms with the batch size would let a row's greedy answer depend on its company.

Half-precision rows (bf16, fp16) multiply in their own dtype, keys first (``keys @
queries^T``: a tall, thin product oneDNN runs 3-4x faster than ``queries @ keys^T``
here), and softmax in fp32. Small caches on CPU attend in fp32 copies instead, where
the copies cost less than bf16's slower small products. Per layer, bf16, this EPYC:

| rows x columns | fp32 copies | own dtype |
| --- | --- | --- |
| 1 x 100 | 47 us | 95 us |
| 1 x 1,500 | 226 | 206 |
| 8 x 600 | 459 | 345 |
| 32 x 150 | 414 | 347 |
| 32 x 600 | 2,040 | 1,362 |
| 16 x 1,450 | 2,472 | 1,827 |

(The copies of a long cache were a quarter of a 16-row bf16 decode step at 1,450
columns, torch.profiler.) Scores are scaled, masked and widened to fp32 in one pass
(``bias + scale * scores``, the bias made once per step): ``masked_fill_`` alone took
176 us a layer at 16 x 1,472 in bf16 (5.3 of an 83 ms step, torch.profiler), and the
attention went from 1,665 to 1,178 us a layer there (fp32: 1,866 to 1,791), with the
same outputs. So which path a bf16 row takes depends on the batch's size:
bf16 answers are not batch-invariant anyway (docs/performance.md); fp32 ones are.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from worker.engine import cpu_kernels
from worker.engine.cpu_kernels import choices

logger = logging.getLogger(__name__)

ATTENTION_NAME = "tokenferry_decode"
# The same attention whose eager CPU decode steps run the fused C++ kernel (``cpu_kernels``).
KERNEL_ATTENTION_NAME = "tokenferry_decode_kernel"
# Below this many cached positions (rows x columns), half-precision rows on CPU attend in fp32
# copies (see the table above); from it on, in their own dtype.
SMALL_CACHE_POSITIONS = 1024
# Keyword arguments some models pass that this path does not implement: sdpa (or the model's
# fallback) handles them.
_UNHANDLED = ("softcap", "s_aux", "sliding_window", "position_bias", "head_mask")
# What the fused kernels are built for.
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def decode_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention output ``[rows, queries, heads, head_dim]``, as transformers' sdpa returns it."""
    if not _is_decode(query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    assert attention_mask is not None
    return _matmul_attention(query, key, value, attention_mask, scaling), None


def kernel_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """As ``decode_attention_forward``, with eager CPU steps in the fused kernels
    (``cpu_kernels/attention.cpp``): a decode step's rows each read only their own columns, in
    one pass; a prefill chunk runs as flash attention, causal blocks skipped."""
    # A compiled step traces the matmuls (compiled_decode.py): the kernels are opaque to it.
    kernels = None if torch.compiler.is_compiling() else cpu_kernels.kernels()
    if kernels is not None and query.device.type == "cpu" and query.dtype in _KERNEL_DTYPES:
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        if _is_decode(query, key, attention_mask, dropout, kwargs):
            assert attention_mask is not None
            if attention_mask.shape[0] == query.shape[0] and key.stride(-1) == 1 and value.stride(-1) == 1:
                return kernels.decode_attention(query, key, value, attention_mask, scale), None
        elif kernels.prefill_supported() and _prefill_kernel_serves(
            module, query, key, value, attention_mask, dropout, kwargs
        ):
            # bf16 in bf16 dot products or in fp32, whichever this machine runs faster (``choices``).
            dots = query.dtype == torch.bfloat16 and choices.bf16_dot_products(kernels)
            return kernels.prefill_attention(query, key, value, attention_mask, scale, dots), None
    return decode_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


def _matmul_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    rows, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    scale = head_dim**-0.5 if scaling is None else scaling
    grouped = query.reshape(rows, kv_heads, groups, head_dim)
    in_fp32 = _in_fp32(key)
    if in_fp32:
        scores = torch.matmul(grouped.float(), key.float().transpose(-1, -2))  # [rows, kv, groups, columns]
    else:
        scores = torch.matmul(key, grouped.transpose(-1, -2)).transpose(-1, -2)
    # One pass scales, masks and (half precision) widens to fp32: bias + scale * scores.
    scores = torch.add(_additive_bias(attention_mask), scores, alpha=scale)
    weights = torch.softmax(scores, dim=-1)
    if in_fp32:
        output = torch.matmul(weights, value.float()).to(query.dtype)  # [rows, kv, groups, head_dim]
    else:
        output = torch.matmul(weights.to(value.dtype), value)
    return output.reshape(rows, 1, heads, head_dim)


class _BiasMemo:
    """The additive form of the last mask seen: every layer of a step gets the same mask object."""

    mask: torch.Tensor | None = None
    bias: torch.Tensor | None = None


def _additive_bias(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` as an fp32 bias (0 where attended, -inf elsewhere), made once per eager CPU step.

    Only there: a CUDA graph's static mask is rewritten in place between replays, and a
    compiled step traces this function, so both compute it per layer.
    """
    if torch.compiler.is_compiling() or mask.device.type != "cpu":
        return torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, float("-inf"))
    if _BiasMemo.mask is not mask:
        _BiasMemo.bias = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
        _BiasMemo.mask = mask
    assert _BiasMemo.bias is not None
    return _BiasMemo.bias


def _in_fp32(key: torch.Tensor) -> bool:
    """Whether this step attends in fp32: fp32 models, and half-precision ones' small caches on CPU."""
    if key.dtype == torch.float32:
        return True
    if key.device.type != "cpu":
        return False
    # A compiled step (``compiled_decode.py``) keeps one path: a branch on its dynamic column count
    # would be a guard, and crossing it a recompile (50 s) mid-serving.
    return torch.compiler.is_compiling() or key.shape[0] * key.shape[2] < SMALL_CACHE_POSITIONS


def _prefill_kernel_serves(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    kwargs: dict[str, Any],
) -> bool:
    """Whether the prefill kernel computes what sdpa would here: head_dim 64 or 128, a boolean
    mask per query, or none on a causal layer whose queries are its last keys."""
    if attention_mask is None:
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else causal
        masked = causal and query.shape[2] == key.shape[2] and query.shape[2] > 1
    else:
        masked = (
            attention_mask.dtype == torch.bool
            and attention_mask.dim() == 4
            and attention_mask.shape[0] == query.shape[0]
            and attention_mask.shape[1] == 1
            and attention_mask.shape[2:] == (query.shape[2], key.shape[2])
        )
    return (
        masked
        and query.shape[-1] in (64, 128)
        and query.shape[1] % key.shape[1] == 0
        and key.shape[0] == query.shape[0]
        and query.stride(-1) == 1
        and key.stride(-1) == 1
        and value.stride(-1) == 1
        and dropout == 0.0
        and all(kwargs.get(name) is None for name in _UNHANDLED)
    )


def _is_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    kwargs: dict[str, Any],
) -> bool:
    return (
        query.shape[2] == 1
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.shape[1] == 1
        and attention_mask.shape[-1] == key.shape[2]
        and query.shape[1] % key.shape[1] == 0
        and dropout == 0.0
        and all(kwargs.get(name) is None for name in _UNHANDLED)
    )


def register() -> None:
    """Make both attentions known to transformers (idempotent): these forwards, sdpa's masks."""
    AttentionInterface.register(ATTENTION_NAME, decode_attention_forward)
    AttentionInterface.register(KERNEL_ATTENTION_NAME, kernel_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    AttentionMaskInterface.register(KERNEL_ATTENTION_NAME, sdpa_mask)


def use_decode_attention(model: PreTrainedModel, kernel: bool = True) -> bool:
    """Switch ``model`` to this attention when it runs transformers' sdpa now; whether it runs it.

    ``kernel``: on CPU, decode steps in the fused kernel where it builds here (``cpu_kernels``);
    otherwise, or where it cannot be built (logged), as matmuls.
    """
    current = getattr(model.config, "_attn_implementation", None)
    if current in (ATTENTION_NAME, KERNEL_ATTENTION_NAME):
        return True
    if current != "sdpa":
        logger.info("decode attention left as %s (the fast path replaces sdpa only)", current)
        return False
    register()
    name = ATTENTION_NAME
    if kernel and model.device.type == "cpu" and cpu_kernels.kernels() is not None:
        name = KERNEL_ATTENTION_NAME
    try:
        model.set_attn_implementation(name)
    except (ValueError, KeyError, ImportError) as error:
        logger.info("decode attention not available for this model (%s); keeping sdpa", error)
        return False
    return True
