"""Owns the running batch's KV cache: one left-padded ``DynamicCache`` plus its attention mask.

Choice (measured on a 2-core CPU, SmolLM2-135M fp32, 64 new tokens each):
one sequence at a time reaches ~12 tok/s, a padded batch of 32 through
``model.generate`` ~109 tok/s, transformers' paged ``generate_batch`` ~50 tok/s.
A padded batch is the layout that reaches the ceiling here, so the engine keeps
the whole running batch in one left-padded cache and does the TGI algebra on it.
With it, this engine stepped in-process matched the static ``generate`` batch
(1.04x, 0.99x, 1.08x, 0.97x at 1, 8, 32, 64 requests; ``make bench``, one run)
and ran 2.05x transformers' ``generate_batch`` at 64. The operations:
``append`` (a freshly prefilled sequence joins, the shorter side is left-padded),
``keep`` (finished or aborted rows leave) and a left trim of columns that have
become padding for every row. Every decode step is then one forward over
``[batch, 1]`` tokens. Padding costs memory and attention work proportional to
the length spread in the batch; admission by token budget (``scheduler.py``)
bounds it. A row may also hold padding in its middle: a prompt prefilled on top
of a reused prefix (``prefix_cache.py``) sits as [padding, prefix, padding,
rest] in the group it is prefilled with (``stack_left_padded``); the mask covers
it, and ``keep`` trims only columns that are padding for every row.

A forward pass that fails leaves the cache half-written: the layers before the
failure have appended a column, the mask may have grown. ``checkpoint`` and
``restore`` undo that exactly and for free: every operation here and the layers'
own ``update`` replace tensors rather than writing into them, so keeping the
references taken before the forward is keeping the cache as it was.

Intentional divergence: transformers' cache layers are rewritten in place
(``layer.keys``/``layer.values``). That is version-specific, so it lives here
alone; ``DynamicCache`` keeps its public role for the model's forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedConfig
from transformers.cache_utils import DynamicLayer


@dataclass(frozen=True, slots=True)
class CacheCheckpoint:
    """The tensors a ``PaddedKVCache`` held at one moment (references, not copies)."""

    attention_mask: torch.Tensor
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class PaddedKVCache:
    """A left-padded batch cache; row ``i`` is the ``i``-th running sequence."""

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

    @property
    def length(self) -> int:
        return int(self.attention_mask.shape[1])

    def next_positions(self) -> torch.Tensor:
        """Position id of each row's next token: the count of its real tokens so far."""
        return self.attention_mask.sum(dim=1, keepdim=True)

    def grow_mask(self) -> torch.Tensor:
        """The mask for a forward that appends one token to every row (kept as the new mask)."""
        ones = torch.ones(
            (self.batch_size, 1), dtype=self.attention_mask.dtype, device=self.attention_mask.device
        )
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
        return self.attention_mask

    def append(self, other: PaddedKVCache) -> None:
        """Add ``other``'s rows after ours, left-padding whichever side is shorter."""
        length = max(self.length, other.length)
        mine, theirs = self._padded_layers(length), other._padded_layers(length)
        for layer, (keys, values), (other_keys, other_values) in zip(
            self._layers(), mine, theirs, strict=True
        ):
            layer.keys = torch.cat([keys, other_keys], dim=0)
            layer.values = torch.cat([values, other_values], dim=0)
        self.attention_mask = torch.cat(
            [_left_pad(self.attention_mask, length, dim=1), _left_pad(other.attention_mask, length, dim=1)],
            dim=0,
        )

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order), then drop columns that are padding for every row."""
        index = torch.tensor(rows, dtype=torch.long, device=self.attention_mask.device)
        self.attention_mask = self.attention_mask.index_select(0, index)
        start = self._first_used_column()
        for layer in self._layers():
            keys, values = _tensors(layer)
            layer.keys = keys.index_select(0, index)[:, :, start:, :]
            layer.values = values.index_select(0, index)[:, :, start:, :]
        self.attention_mask = self.attention_mask[:, start:]

    def checkpoint(self) -> CacheCheckpoint:
        """What ``restore`` brings back: the cache as it is now."""
        return CacheCheckpoint(self.attention_mask, [_tensors(layer) for layer in self._layers()])

    def restore(self, checkpoint: CacheCheckpoint) -> None:
        """Undo whatever happened since ``checkpoint`` (a failed forward's half-written columns)."""
        self.attention_mask = checkpoint.attention_mask
        for layer, (keys, values) in zip(self._layers(), checkpoint.layers, strict=True):
            layer.keys, layer.values = keys, values

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``row``'s KV at its real (mask 1) columns, in order; per layer ``[heads, tokens, dim]``."""
        columns = self.attention_mask[row].nonzero().squeeze(1)
        return [
            (keys[row].index_select(1, columns), values[row].index_select(1, columns))
            for keys, values in map(_tensors, self._layers())
        ]

    def _first_used_column(self) -> int:
        used = self.attention_mask.any(dim=0).nonzero()
        return int(used[0]) if len(used) else self.length

    def _padded_layers(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        padded = []
        for layer in self._layers():
            keys, values = _tensors(layer)
            padded.append((_left_pad(keys, length, dim=2), _left_pad(values, length, dim=2)))
        return padded


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
