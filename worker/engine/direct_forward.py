"""Owns the direct forward: a Llama-family model's decode steps and prefills, run over its own
modules without transformers' model and layer forwards around them.

Why: on CPU, a small batch's decode step is mostly Python. At one row in bf16 on this 2-core
EPYC, a 26.5 ms step spent 14.4 ms in the Linears, about 5 ms in the other ops and about 7 ms
in the HF forward's Python: per-layer module calls and keyword plumbing, output capturing,
mask creation, the layer list sliced into a new ``ModuleList`` every step (torch.profiler and
py-spy). Calling the same modules' ``forward``s in a plain loop, median of 60 steps in
process, SmolLM2-135M bf16: 1 row 26.4 -> 20.4 ms, 8 rows 31.3 -> 23.7 ms, 32 rows
51.0 -> 43.9 ms. vLLM and SGLang write their own model code for the same reason.

Prefills take the same path (``prefill_logits``) for the ops the model's forward runs one by
one: a prompt's rotation in one kernel pass instead of transformers' five ops (multiplies, a
negation, a concatenation, an add: about 80 ms of a 2,084 ms fp32 prefill step of 1,850
tokens, torch.profiler, 2-core Xeon) and each residual add in the next norm's pass (about
20 ms). Its mask is the one the model's forward would build (transformers'
``create_causal_mask``, same arguments).

A decode step's attention, per layer, is one kernel call where the layers allow it
(``_step_attention``: the kernel attention registered, QKV fused, no per-head norms):
``cpu_kernels/step_attention.cpp`` rotates the fused product's queries and keys, writes each
row's key and value into its slot and attends, the same kernels as the ops it replaces, so the
same logits and cache bit for bit (tested). What goes is the Python between them (views, the
attention interface's checks, two advanced-index writes of the slot cache's ``update``).
Steps alternating with and without it in one process, SmolLM2-135M, this EPYC: fp32 1 row
36.3-36.6 -> 33.2-33.8 ms, 8 rows 43.3-45.8 -> 39.8-39.9, 32 rows 84.9-95.2 -> 79.3-88.0;
bf16 1 row 22.1-22.4 -> 19.6-19.8, 8 rows 27.3-30.8 -> 24.4-28.1, 32 rows 55.6-58.5 -> 52.5-55.1.

A forward is the model's own arithmetic in the model's own order: its embedding, its rotary
module (every rope scaling variant its own), per layer its norms, projections (the fused
ones read once: ``fused_projections.py``), its module's ``apply_rotary_pos_emb`` (in one kernel
pass for queries and keys where the CPU kernels are built, with its roundings), the slot
cache's ``update``, the attention registered on the model (``decode_attention.py``) and its
MLP; then its final norm and LM head. Where the norms run in the CPU kernels
(``worker/model/kernel_layers.py``), each residual add happens in the next norm's pass (vLLM's
``fused_add_rms_norm``), rounded as the separate add is. So the logits are bitwise the same as
the model's forward (tested): only the Python around the ops is gone.

What it serves (``DirectForward.build``): exactly the transformers classes of ``FAMILIES``
(not subclasses, nor models whose forward was replaced or hooked: they keep it), full
attention on every layer, the decode attention registered, CPU, eager steps. GPUs replay
CUDA graphs and ``--compile`` traces the model's forward instead. Any other model keeps its
forward, with a log line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from worker.engine.cpu_kernels import CpuKernels
from worker.engine.decode_attention import ATTENTION_NAME, KERNEL_ATTENTION_NAME
from worker.engine.slot_cache import SlotKVCache

logger = logging.getLogger(__name__)

# Causal LM classes whose forward is Llama's (per layer: norm, attention, residual, norm, gated MLP,
# residual), and whether their attention normalizes each head's queries and keys (Qwen3).
FAMILIES = {
    "LlamaForCausalLM": False,
    "MistralForCausalLM": False,
    "Qwen2ForCausalLM": False,
    "Qwen3ForCausalLM": True,
}

Tensor = torch.Tensor
Forward = Callable[[Tensor], Tensor]
AddNorm = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's parts, as bound forwards (no module call machinery per step)."""

    attention: torch.nn.Module
    projections: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]
    # The fused QKV product, unsplit, and its queries', keys' and values' widths (None where the
    # projections are not fused).
    qkv: Forward | None
    qkv_widths: list[int] | None
    query_norm: Forward | None
    key_norm: Forward | None
    output: Forward
    # (delta, residual) -> (norm(residual + delta), residual + delta): this layer's post-attention
    # norm, then the next layer's input norm (the model's final norm after the last layer).
    post_norm: AddNorm
    next_norm: AddNorm
    mlp: Forward


@dataclass(frozen=True)
class PromptForward:
    """A prefill's operands, as ``DirectForward.prefill_logits`` takes them."""

    input_ids: Tensor
    attention_mask: Tensor | None
    positions: Tensor
    cache: Cache
    keep: int


class DirectForward:
    """The forward of a model of ``FAMILIES``: ``logits`` runs a decode step, ``prefill_logits`` a
    prefill (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, kernels: CpuKernels | None = None) -> None:
        config = model.config
        self._config = config
        base = model.model
        self._embed: Forward = base.embed_tokens.forward
        self._rotary = base.rotary_emb.forward
        self._head: Forward = model.lm_head.forward
        self._attend = ALL_ATTENTION_FUNCTIONS[config._attn_implementation]
        modeling = sys.modules[type(base.layers[0].self_attn).__module__]
        self._rotate = _rotation(modeling.apply_rotary_pos_emb, kernels)
        self._head_dim = int(base.layers[0].self_attn.head_dim)
        self._first_norm: Forward = base.layers[0].input_layernorm.forward
        next_norms = [layer.input_layernorm for layer in base.layers[1:]] + [base.norm]
        self._layers = [_parts(layer, norm) for layer, norm in zip(base.layers, next_norms, strict=True)]
        self._heads = int(config.num_attention_heads)
        self._append_and_attend = _step_attention(self._layers, config, kernels)

    @classmethod
    def build(cls, model: PreTrainedModel, kernels: CpuKernels | None = None) -> DirectForward | None:
        """The direct step for ``model``, or None (logged) when its forward must run as it is;
        ``kernels``: the CPU kernels its rotation runs in (``cpu_kernels``), if any."""
        reason = _unserved_because(model)
        if reason is not None:
            logger.info("decode steps and prefills run the model's forward: %s", reason)
            return None
        return cls(model, kernels)

    def logits(self, kv: SlotKVCache, last_tokens: list[int]) -> Tensor:
        """The next-token logits ``[rows, vocab]`` of every row of ``kv``; the caller advances ``kv``."""
        positions, mask = kv.begin_decode()
        # [rows, 1, hidden], as the model's forward holds them: every op sees the model's shapes.
        hidden = self._embed(torch.tensor(last_tokens, device=mask.device).unsqueeze(1))
        if self._append_and_attend is not None and kv.kernel_writable(hidden.dtype):
            cos, sin = self._rotary(hidden, positions)
            # The rotation kernel's operands (else the model's rotation runs, in ``_run``).
            if cos.dtype == hidden.dtype and cos.dim() == 3 and cos.stride(-1) == 1:
                return self._decode(hidden, (cos, sin), kv, self._append_and_attend)[:, -1, :]
        return self._run(hidden, positions, kv, mask, keep=1)[:, -1, :]

    def prefill_logits(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        positions: Tensor,
        cache: Cache,
        keep: int,
    ) -> Tensor:
        """What the model's forward returns as logits for these arguments (``position_ids``,
        ``past_key_values``, ``logits_to_keep``=``keep``: 0 for every position), ``cache`` updated
        as it updates it."""
        hidden = self._embed(input_ids)
        # The attention registered here masks as sdpa does: a boolean tensor or None, never a BlockMask.
        mask = create_causal_mask(
            config=self._config,
            inputs_embeds=hidden,
            attention_mask=attention_mask,
            past_key_values=cache,
            position_ids=positions,
        )
        return self._run(hidden, positions, cache, cast(Tensor | None, mask), keep)

    @property
    def mixes(self) -> bool:
        """Whether ``mixed_logits`` can run: the one-call decode attention is chosen (``_step_attention``)."""
        return self._append_and_attend is not None

    def mixed_logits(
        self, kv: SlotKVCache, last_tokens: list[int], prompts: PromptForward
    ) -> tuple[Tensor, Tensor] | None:
        """A decode step of every row of ``kv`` and a prefill of ``prompts`` in one forward: the rows'
        next-token logits ``[rows, vocab]`` and what ``prefill_logits`` returns for the prompts, or
        None (nothing run) where the step's operands do not suit the one-call attention.

        Every token goes through the norms, products and MLPs together, the rows' and the prompts'
        (vLLM's mixed batch): one pass over the weights where a decode step and a prefill took two.
        Only the attention differs: the rows' in one kernel call over the slot cache, as ``logits``;
        the prompts' over ``prompts.cache``, as ``prefill_logits``. The caller advances ``kv``.
        """
        rows, (count, width) = len(last_tokens), prompts.input_ids.shape
        step_positions, _ = kv.begin_decode()
        tokens = torch.tensor(last_tokens, device=prompts.input_ids.device)
        # [1, rows + prompts x width, hidden]: the rows' tokens, then each prompt's, padding included.
        hidden = self._embed(torch.cat([tokens, prompts.input_ids.reshape(-1)]).unsqueeze(0))
        step_hidden, prompt_hidden = hidden[0, :rows].unsqueeze(1), hidden[0, rows:].view(count, width, -1)
        cos, sin = self._rotary(step_hidden, step_positions)
        attend = self._append_and_attend
        if attend is None or not kv.kernel_writable(hidden.dtype):
            return None
        if cos.dtype != hidden.dtype or cos.dim() != 3 or cos.stride(-1) != 1:
            return None
        prompt_rotation = self._rotary(prompt_hidden, prompts.positions)
        mask = cast(  # the attention registered here masks as sdpa does: a tensor or None
            Tensor | None,
            create_causal_mask(
                config=self._config,
                inputs_embeds=prompt_hidden,
                attention_mask=prompts.attention_mask,
                past_key_values=prompts.cache,
                position_ids=prompts.positions,
            ),
        )
        write_positions, _, step_mask = kv.step_tensors()
        heads = self._heads
        normed = self._first_norm(hidden)
        for index, layer in enumerate(self._layers):
            qkv = cast(Forward, layer.qkv)(normed)[0]
            keys, values, scale = kv.keys[index], kv.values[index], layer.attention.scaling
            step_qkv = qkv[:rows].unsqueeze(1)
            step = attend(step_qkv, cos, sin, keys, values, write_positions, step_mask, heads, scale)
            projected = torch.split(
                qkv[rows:].view(count, width, -1), cast(list[int], layer.qkv_widths), dim=-1
            )
            attended = self._attention(layer, index, projected, prompts.cache, prompt_rotation, mask)
            attended = torch.cat([step.view(rows, -1), attended.reshape(count * width, -1)]).unsqueeze(0)
            normed, hidden = layer.post_norm(layer.output(attended), hidden)
            normed, hidden = layer.next_norm(layer.mlp(normed), hidden)
        # One head product for the rows and the prompts' kept positions (every position: 0).
        normed_prompts = normed[0, rows:].view(count, width, -1)[:, -prompts.keep :]
        kept = normed_prompts.shape[1]
        logits = self._head(torch.cat([normed[0, :rows], normed_prompts.reshape(count * kept, -1)]))
        return logits[:rows], logits[rows:].view(count, kept, -1)

    def _attention(
        self,
        layer: _Layer,
        index: int,
        projected: Sequence[Tensor],
        cache: Cache,
        rotation: tuple[Tensor, Tensor],
        mask: Tensor | None,
    ) -> Tensor:
        """One layer's attention over its projected queries, keys and values (each ``[rows, width,
        heads x head_dim]``): per-head norms, rotation, ``cache.update``, the attention registered.
        ``[rows, width, heads x head_dim]``, ``cache`` updated."""
        queries, keys, values = projected
        rows, width = queries.shape[:2]
        head_shape = (rows, width, -1, self._head_dim)
        queries, keys = queries.view(head_shape), keys.view(head_shape)
        if layer.query_norm is not None and layer.key_norm is not None:
            queries, keys = layer.query_norm(queries), layer.key_norm(keys)
        queries, keys = self._rotate(queries.transpose(1, 2), keys.transpose(1, 2), *rotation)
        keys, values = cache.update(keys, values.view(head_shape).transpose(1, 2), index)
        attended: Tensor = self._attend(
            layer.attention, queries, keys, values, mask, dropout=0.0, scaling=layer.attention.scaling
        )[0]
        return attended.reshape(rows, width, -1)

    def _decode(
        self, hidden: Tensor, rotation: tuple[Tensor, Tensor], kv: SlotKVCache, attend: Callable[..., Tensor]
    ) -> Tensor:
        """``_run``'s arithmetic for a decode step, each layer's attention in one kernel call
        (``cpu_kernels/step_attention.cpp``: rotation, slot writes, attention)."""
        cos, sin = rotation
        write_positions, _, mask = kv.step_tensors()
        normed = self._first_norm(hidden)
        for index, layer in enumerate(self._layers):
            assert layer.qkv is not None
            keys, values, scale = kv.keys[index], kv.values[index], layer.attention.scaling
            qkv = layer.qkv(normed)
            attended = attend(qkv, cos, sin, keys, values, write_positions, mask, self._heads, scale)
            normed, hidden = layer.post_norm(layer.output(attended), hidden)
            normed, hidden = layer.next_norm(layer.mlp(normed), hidden)
        return self._head(normed)

    def _run(self, hidden: Tensor, positions: Tensor, cache: Cache, mask: Tensor | None, keep: int) -> Tensor:
        """The decoder layers, the final norm and the head over the last ``keep`` positions (0: all)."""
        cos, sin = self._rotary(hidden, positions)
        normed = self._first_norm(hidden)
        for index, layer in enumerate(self._layers):
            projected = layer.projections(normed)
            attended = self._attention(layer, index, projected, cache, (cos, sin), mask).contiguous()
            normed, hidden = layer.post_norm(layer.output(attended), hidden)
            normed, hidden = layer.next_norm(layer.mlp(normed), hidden)
        return self._head(normed[:, -keep:, :])


def _parts(layer: Any, next_norm: Any) -> _Layer:
    attention = layer.self_attn
    return _Layer(
        attention=attention,
        projections=_split_projections(attention, ("q_proj", "k_proj", "v_proj"), "qkv_fused"),
        qkv=attention.qkv_fused.linear.forward if hasattr(attention, "qkv_fused") else None,
        qkv_widths=[getattr(attention, name).out_features for name in ("q_proj", "k_proj", "v_proj")]
        if hasattr(attention, "qkv_fused")
        else None,
        query_norm=attention.q_norm.forward if hasattr(attention, "q_norm") else None,
        key_norm=attention.k_norm.forward if hasattr(attention, "k_norm") else None,
        output=attention.o_proj.forward,
        post_norm=_add_norm(layer.post_attention_layernorm),
        next_norm=_add_norm(next_norm),
        mlp=layer.mlp.forward,
    )


def _step_attention(
    layers: list[_Layer], config: Any, kernels: CpuKernels | None
) -> Callable[..., Tensor] | None:
    """The one-call decode attention (``CpuKernels.append_and_attend``) where it computes what the
    layers' ops do: the attention kernel registered, QKV fused, no per-head query or key norm."""
    if kernels is None or config._attn_implementation != KERNEL_ATTENTION_NAME:
        return None
    if any(layer.qkv is None or layer.query_norm is not None for layer in layers):
        return None
    return kernels.append_and_attend


def _rotation(model_rotation: Any, kernels: CpuKernels | None) -> Any:
    """The model's ``apply_rotary_pos_emb``, in one kernel pass for queries and keys where the
    kernels are built (``cpu_kernels/layers.cpp``: its three roundings, bit for bit); the model's
    own function for what the kernel does not take."""
    if kernels is None:
        return model_rotation
    rotary = kernels.rotary

    def rotate(queries: Tensor, keys: Tensor, cos: Tensor, sin: Tensor) -> Any:
        if queries.dtype == keys.dtype == cos.dtype == sin.dtype and cos.dim() == 3 and cos.stride(-1) == 1:
            return rotary(queries, keys, cos, sin)
        return model_rotation(queries, keys, cos, sin)

    return rotate


def _add_norm(norm: Any) -> AddNorm:
    """The residual add and ``norm`` after it: in one kernel pass where the norm has one
    (``worker/model/kernel_layers.py``), else the model's add and the norm's forward."""
    fused: AddNorm | None = getattr(norm, "add_forward", None)
    if fused is not None:
        return fused
    forward = norm.forward

    def add_then_norm(delta: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        total = residual + delta
        return forward(total), total

    return add_then_norm


def _split_projections(parent: Any, names: tuple[str, ...], fused_name: str) -> Any:
    """The group's outputs of one input: one fused product's columns where the group was fused
    (``fused_projections.py``), each Linear's own product otherwise."""
    fused = getattr(parent, fused_name, None)
    if fused is None:
        forwards = [getattr(parent, name).forward for name in names]
        return lambda hidden: tuple(forward(hidden) for forward in forwards)
    product: Forward = fused.linear.forward
    widths = [getattr(parent, name).out_features for name in names]
    return lambda hidden: torch.split(product(hidden), widths, dim=-1)


def _unserved_because(model: PreTrainedModel) -> str | None:
    """Why the direct step cannot stand in for ``model``'s forward; None when it can."""
    kind = type(model)
    if kind.__name__ not in FAMILIES or not kind.__module__.startswith("transformers.models."):
        return f"{kind.__name__} is not one of the model classes it implements"
    if "forward" in vars(model) or _hooked(model):
        return "the model's forward is replaced or hooked"
    if model.device.type != "cpu":
        return "not on CPU"
    config = model.config
    if config._attn_implementation not in (ATTENTION_NAME, KERNEL_ATTENTION_NAME):
        return f"attention is {config._attn_implementation}, not the decode attention"
    layers = model.model.layers
    if len(layers) != config.num_hidden_layers:
        return "the layer count differs from the config's"
    for layer in layers:
        attention = layer.self_attn
        # Mistral's attention reads the config's window; Qwen's layers hold their own.
        window = getattr(attention, "sliding_window", getattr(config, "sliding_window", None))
        if window is not None:
            return "sliding-window attention"
        if hasattr(attention, "q_norm") != FAMILIES[kind.__name__]:
            return "an attention layout it does not implement"
    return None


def _hooked(model: torch.nn.Module) -> bool:
    return any(
        module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook")
        for module in model.modules()
    )
