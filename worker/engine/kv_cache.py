"""Owns the prefill batch's KV cache: one left-padded ``DynamicCache`` plus its attention mask.

The prompts whose prefill ends in a step run as one padded forward (``hf.py``):
row ``i`` is [padding, what it already held, padding, the rest of its prompt]
(``prefill_layout``, ``stack_left_padded``), the mask marks the real columns, and
the model fills a ``DynamicCache`` through its public API. What leaves this cache is
each row's real columns: into the running batch's slots (``slot_cache.SlotKVCache``)
and into the prefix cache (``row_kv``). Until the slot cache, the running batch lived
here too, grown by ``torch.cat`` every step.

Intentional divergence: transformers' cache layers are read as ``layer.keys`` and
``layer.values``. That is version-specific, so it lives here alone.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedConfig
from transformers.cache_utils import DynamicLayer


class PaddedKVCache:
    """A left-padded batch cache of prompts prefilled together; row ``i`` is the ``i``-th prompt."""

    def __init__(self, cache: DynamicCache, attention_mask: torch.Tensor) -> None:
        self.cache = cache
        self.attention_mask = attention_mask  # [batch, length]; 0 marks padding

    @staticmethod
    def supports(config: PreTrainedConfig) -> bool:
        """Whether every layer of this model's cache is plain full attention (no sliding window, no
        linear attention), the only kind whose rows can be padded, merged and trimmed like this."""
        return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)

    def _layers(self) -> list[DynamicLayer]:
        return _full_attention_layers(self.cache)

    @property
    def batch_size(self) -> int:
        return int(self.attention_mask.shape[0])

    def layer_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values, ``[rows, kv_heads, length, head_dim]``."""
        return [_tensors(layer) for layer in self._layers()]

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``row``'s KV at its real (mask 1) columns, in order; per layer ``[heads, tokens, dim]``.

        A lone row without padding hands over its own tensors, not copies: nothing writes them
        after its forward, and copying a 1,500-token prompt's KV for the prefix cache took 25 ms
        of its 1.7 s fp32 prefill (torch.profiler, 2-core Xeon). Other rows are gathered apart, so
        the prefix cache never keeps a whole batch's tensors alive for one row.
        """
        if self.batch_size == 1 and bool(self.attention_mask.all()):
            return [(keys[0], values[0]) for keys, values in map(_tensors, self._layers())]
        columns = self.attention_mask[row].nonzero().squeeze(1)
        return [
            (keys[row].index_select(1, columns), values[row].index_select(1, columns))
            for keys, values in map(_tensors, self._layers())
        ]


def single_row_cache(
    layers: list[tuple[torch.Tensor, torch.Tensor]], config: PreTrainedConfig
) -> DynamicCache:
    """A one-row cache holding ``layers`` (per layer ``[kv_heads, tokens, head_dim]``), via the public API."""
    cache = DynamicCache(config=config)
    for index, (keys, values) in enumerate(layers):
        cache.update(keys.unsqueeze(0), values.unsqueeze(0), index)
    return cache


def stack_left_padded(rows: list[DynamicCache | None], length: int, config: PreTrainedConfig) -> DynamicCache:
    """One batch cache ``length`` columns wide: row ``i`` is the one-row cache ``rows[i]`` left-padded
    (None: all padding). Empty when ``length`` is 0."""
    cache = DynamicCache(config=config)
    per_row = [
        None if row is None else [_tensors(layer) for layer in _full_attention_layers(row)] for row in rows
    ]
    template = next((layers for layers in per_row if layers is not None), None)
    if length == 0 or template is None:
        return cache
    for index, (keys, values) in enumerate(template):
        nothing = (keys[:, :, :0], values[:, :, :0])  # a row with no past: all of it is padding
        padded = [nothing if layers is None else layers[index] for layers in per_row]
        cache.update(
            torch.cat([_left_pad(row_keys, length, dim=2) for row_keys, _ in padded], dim=0),
            torch.cat([_left_pad(row_values, length, dim=2) for _, row_values in padded], dim=0),
            index,
        )
    return cache


def prefill_layout(held: list[int], rests: list[tuple[int, ...]]) -> tuple[list[list[int]], list[list[int]]]:
    """Input ids and attention mask of rows that already hold ``held[i]`` tokens (left-padded to the
    most held) and go on with ``rests[i]`` (left-padded to the longest rest)."""
    past, width = max(held), max(len(rest) for rest in rests)
    input_ids = [[0] * (width - len(rest)) + list(rest) for rest in rests]
    mask = [
        [0] * (past - count) + [1] * count + [0] * (width - len(rest)) + [1] * len(rest)
        for count, rest in zip(held, rests, strict=True)
    ]
    return input_ids, mask


def _full_attention_layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = [layer for layer in cache.layers if type(layer) is DynamicLayer]
    if len(layers) != len(cache.layers):
        raise TypeError("PaddedKVCache holds full-attention DynamicLayers only")
    return layers


def _tensors(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    if layer.keys is None or layer.values is None:
        raise ValueError("a cache layer of the running batch holds no tensors")
    return layer.keys, layer.values


def _left_pad(tensor: torch.Tensor, length: int, *, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
