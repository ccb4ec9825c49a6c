"""Owns the prompt prefix cache: the KV of recent prompts, kept for later prompts that start the same way.

Why: every chat prompt rendered with a model's template starts with the same
tokens. With SmolLM2 that is the default system prompt plus
``<|im_start|>user\\n``, about 24 of the bench workload's ~40 prompt tokens, and
prefill is ~40% of that workload's compute on a 2-core CPU. vLLM (hashed KV
blocks) and SGLang (a radix tree) reuse such prefixes ("automatic prefix
caching"); this is the same idea at the size of one padded-batch engine: a
prompt whose start is already here prefills only the rest.

Layout: an LRU (``OrderedDict``) of whole prompts, each with its per-layer KV
``(keys, values)`` shaped ``[kv_heads, length, head_dim]`` (no batch dim, no
padding), bounded by a budget of stored tokens. A lookup is the longest common
prefix against every entry, with an early exit per entry; the budget bounds the
work (4096 tokens by default: microseconds beside a forward pass), so a radix
tree would not pay for its code here.

Numerics caveat: a reused prefix's KV was computed in another forward pass
(another batch, other padding), so float results can differ in the last bits
from recomputing it. Greedy outputs agree in our tests; bitwise equality with
the cache off is not promised (vLLM says the same of its prefix caching).

Intentional divergence: storing a prompt drops the entries that are prefixes
of it. The longer prompt answers every lookup they would, so they only spent
budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Per layer: (keys, values), each [kv_heads, length, head_dim].
KVLayers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """The first ``length`` tokens of a prompt, already computed: their KV per layer."""

    length: int
    layers: KVLayers


class PrefixCache:
    """An LRU of prompts and their KV, bounded by ``max_tokens`` stored tokens (0: off)."""

    def __init__(self, max_tokens: int, min_match: int = 8) -> None:
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: OrderedDict[tuple[int, ...], KVLayers] = OrderedDict()
        self.stored_tokens = 0  # tokens held now, at most max_tokens
        self.hit_tokens = 0  # prompt tokens served from the cache so far

    @property
    def is_enabled(self) -> bool:
        return self.max_tokens > 0

    def match(self, prompt_ids: Sequence[int]) -> PrefixHit | None:
        """The longest cached prefix of ``prompt_ids``, leaving at least its last token to compute."""
        limit = len(prompt_ids) - 1  # the prompt's last logits must come from a forward pass
        if not self.is_enabled or limit < self.min_match:
            return None
        prompt = tuple(prompt_ids[:limit])
        best_key, best = None, 0
        for key in self._entries:
            length = _common_prefix(key, prompt, best)
            if length > best:
                best_key, best = key, length
        if best_key is None or best < self.min_match:
            return None
        self._entries.move_to_end(best_key)
        self.hit_tokens += best
        layers = [(keys[:, :best], values[:, :best]) for keys, values in self._entries[best_key]]
        return PrefixHit(best, layers)

    def store(self, prompt_ids: Sequence[int], layers: KVLayers) -> None:
        """Keep a prompt's KV (the caller hands over tensors it no longer writes), evicting the
        least recently used prompts to stay within budget; a prompt over the budget is not kept."""
        prompt = tuple(prompt_ids)
        if not self.is_enabled or len(prompt) > self.max_tokens:
            return
        covering = next((key for key in self._entries if key[: len(prompt)] == prompt), None)
        if covering is not None:  # already here, as this prompt or a longer one
            self._entries.move_to_end(covering)
            return
        for key in [key for key in self._entries if prompt[: len(key)] == key]:
            self._remove(key)
        self._entries[prompt] = [(keys.contiguous(), values.contiguous()) for keys, values in layers]
        self.stored_tokens += len(prompt)
        while self.stored_tokens > self.max_tokens:
            self._remove(next(iter(self._entries)))

    def __len__(self) -> int:
        return len(self._entries)

    def _remove(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self.stored_tokens -= len(key)


def _common_prefix(key: tuple[int, ...], prompt: tuple[int, ...], best: int) -> int:
    """How many leading tokens ``key`` shares with ``prompt``; 0 when it cannot beat ``best``."""
    if len(key) <= best or key[: best + 1] != prompt[: best + 1]:
        return 0  # one C-speed slice comparison rules most entries out
    length = best + 1
    stop = min(len(key), len(prompt))
    while length < stop and key[length] == prompt[length]:
        length += 1
    return length


def shared_prefixes(prompts: Sequence[Sequence[int]], min_match: int, longest: int) -> list[tuple[int, ...]]:
    """Prefixes that two or more of ``prompts`` share (at least ``min_match``, at most ``longest``
    tokens, and short of each sharer's last token), one per group of prompts starting alike.

    Prompts arriving together before anything is cached (the first burst after a
    start) would each compute their common system prompt; computing it once and
    letting them all reuse it saves that work.
    """
    groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for prompt in prompts:
        if len(prompt) > min_match:
            groups.setdefault(tuple(prompt[:min_match]), []).append(tuple(prompt))
    prefixes = []
    for members in groups.values():
        if len(members) < 2:
            continue
        length = min(min(len(member) for member in members) - 1, longest)
        first = members[0]
        for member in members[1:]:  # all share their first min_match tokens: the group's key
            length = min(length, _common_prefix(member, first, min_match - 1))
        if length >= min_match:
            prefixes.append(first[:length])
    return prefixes
