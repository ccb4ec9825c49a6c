"""The prompt prefix cache: longest-prefix lookups, an LRU bounded by stored tokens, and its counters."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from worker.engine.kv_cache import PaddedKVCache
from worker.engine.prefix_cache import KVLayers, PrefixCache, shared_prefixes

LAYERS = 2
KV_HEADS, HEAD_DIM = 2, 4


def kv_of(prompt: list[int]) -> KVLayers:
    """Per-layer KV whose every position holds its token id (keys) or its negative (values)."""
    column = torch.tensor(prompt, dtype=torch.float32).view(1, -1, 1)
    keys = column.expand(KV_HEADS, len(prompt), HEAD_DIM) + torch.arange(LAYERS).view(LAYERS, 1, 1, 1)
    return [(keys[layer].clone(), -keys[layer].clone()) for layer in range(LAYERS)]


SYSTEM = list(range(100, 112))  # 12 shared tokens, like a chat template's system prompt


def test_match_picks_the_entry_sharing_the_longest_prefix() -> None:
    cache = PrefixCache(max_tokens=1000)
    cache.store([*SYSTEM, 1, 2], kv_of([*SYSTEM, 1, 2]))
    cache.store([*SYSTEM, 7, 8, 9, 10], kv_of([*SYSTEM, 7, 8, 9, 10]))
    hit = cache.match([*SYSTEM, 7, 8, 3, 3])
    assert hit is not None and hit.length == len(SYSTEM) + 2
    keys, values = hit.layers[1]
    assert keys.shape == (KV_HEADS, hit.length, HEAD_DIM)
    assert keys[0, :, 0].tolist() == [float(t + 1) for t in [*SYSTEM, 7, 8]]  # layer 1's keys, in order
    assert torch.equal(values, -keys)


def test_match_leaves_the_last_prompt_token_to_compute() -> None:
    cache = PrefixCache(max_tokens=1000)
    prompt = [*SYSTEM, 1, 2, 3]
    cache.store(prompt, kv_of(prompt))
    same = cache.match(prompt)
    shorter = cache.match(prompt[:-1])
    assert same is not None and same.length == len(prompt) - 1
    assert shorter is not None and shorter.length == len(prompt) - 2


def test_matches_shorter_than_min_match_are_misses() -> None:
    cache = PrefixCache(max_tokens=1000, min_match=8)
    cache.store([*SYSTEM, 1], kv_of([*SYSTEM, 1]))
    assert cache.match([*SYSTEM[:7], 99, 98, 97]) is None
    assert cache.match([*SYSTEM[:8], 99]) is not None
    assert cache.match([5, *SYSTEM]) is None  # no common start at all
    assert cache.hit_tokens == 8


def test_a_zero_budget_turns_the_cache_off() -> None:
    cache = PrefixCache(max_tokens=0)
    cache.store([*SYSTEM, 1], kv_of([*SYSTEM, 1]))
    assert len(cache) == 0 and cache.stored_tokens == 0
    assert cache.match([*SYSTEM, 1, 2]) is None
    assert not cache.is_enabled


def test_least_recently_used_prompts_leave_to_fit_the_token_budget() -> None:
    cache = PrefixCache(max_tokens=30)
    first, second, third = ([*SYSTEM[:9], tail] for tail in (1, 2, 3))  # 10 tokens each, 9 shared
    for prompt in (first, second, third):
        cache.store(prompt, kv_of(prompt))
    assert cache.stored_tokens == 30
    cache.store([50, *range(60, 69)], kv_of([50, *range(60, 69)]))
    assert cache.stored_tokens == 30 and len(cache) == 3
    hits = {tail: cache.match([*SYSTEM[:9], tail, 0]) for tail in (1, 2, 3)}
    assert hits[1] is not None and hits[1].length == 9  # the oldest is gone: only the shared part is left
    assert hits[2] is not None and hits[2].length == 10


def test_a_hit_refreshes_the_entry_so_it_outlives_older_ones() -> None:
    cache = PrefixCache(max_tokens=20)
    old, newer = [*range(1, 11)], [*range(21, 31)]
    cache.store(old, kv_of(old))
    cache.store(newer, kv_of(newer))
    assert cache.match([*old, 0]) is not None  # the oldest is now the most recently used
    cache.store([*range(41, 51)], kv_of([*range(41, 51)]))
    assert cache.match([*old, 0]) is not None
    assert cache.match([*newer, 0]) is None


def test_a_prompt_over_the_budget_is_not_stored() -> None:
    cache = PrefixCache(max_tokens=10)
    kept = [*range(1, 9)]
    cache.store(kept, kv_of(kept))
    cache.store([*range(20, 31)], kv_of([*range(20, 31)]))
    assert cache.stored_tokens == 8 and len(cache) == 1
    assert cache.match([*kept, 0]) is not None


def test_storing_a_prefix_of_an_entry_refreshes_it_and_a_longer_prompt_replaces_its_prefixes() -> None:
    cache = PrefixCache(max_tokens=1000)
    long = [*SYSTEM, 1, 2, 3]
    cache.store(long, kv_of(long))
    cache.store(long[:-1], kv_of(long[:-1]))
    cache.store(long, kv_of(long))
    assert (len(cache), cache.stored_tokens) == (1, len(long))
    longer = [*long, 4, 5]
    cache.store(longer, kv_of(longer))
    assert (len(cache), cache.stored_tokens) == (1, len(longer))


def test_counters_add_up_served_and_stored_tokens() -> None:
    cache = PrefixCache(max_tokens=1000)
    a, b = [*SYSTEM, 1], [*SYSTEM, 2, 2]
    cache.store(a, kv_of(a))
    cache.store(b, kv_of(b))
    assert cache.stored_tokens == len(a) + len(b)
    first = cache.match([*SYSTEM, 2, 2, 9])
    second = cache.match([*SYSTEM, 3])
    assert first is not None and second is not None
    assert cache.hit_tokens == first.length + second.length == (len(SYSTEM) + 2) + len(SYSTEM)


def test_shared_prefixes_are_found_per_group_of_prompts_starting_alike() -> None:
    other = list(range(300, 312))
    prompts = [
        [*SYSTEM, 1, 2, 3],
        [*SYSTEM, 1, 2, 9],
        [*SYSTEM, 7],
        [*other, 5, 6],
        [*other, 5, 8],
        list(range(500, 520)),  # shares nothing
    ]
    assert shared_prefixes(prompts, min_match=8, longest=100) == [tuple(SYSTEM), (*other, 5)]
    # Capped by the longest allowed, and never a sharer's whole prompt (its last token must run).
    assert shared_prefixes(prompts[:2], min_match=8, longest=10) == [tuple(SYSTEM[:10])]
    assert shared_prefixes([SYSTEM, [*SYSTEM, 4]], min_match=8, longest=100) == [tuple(SYSTEM[:-1])]
    assert shared_prefixes(prompts[:1] + prompts[5:], min_match=8, longest=100) == []


def _padded_batch(rows: list[list[int]]) -> PaddedKVCache:
    """A left-padded prefill cache of ``rows`` (token ids as in ``kv_of``), as a padded forward fills it."""
    width = max(len(row) for row in rows)
    cache = DynamicCache()
    for layer in range(LAYERS):
        padded = [kv_of([0] * (width - len(row)) + row)[layer] for row in rows]
        cache.update(torch.stack([k for k, _ in padded]), torch.stack([v for _, v in padded]), layer)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return PaddedKVCache(cache, mask)


def test_a_lone_unpadded_prompt_is_stored_without_a_copy_and_padded_rows_by_their_real_columns() -> None:
    lone = _padded_batch([[*SYSTEM, 1, 2]])
    handed = lone.row_kv(0)
    assert handed[1][0].data_ptr() == lone.layer_tensors()[1][0].data_ptr()  # the forward's own tensors
    expected = kv_of([*SYSTEM, 1, 2])
    pairs = zip(handed, expected, strict=True)
    assert all(torch.equal(k, w) and torch.equal(v, x) for (k, v), (w, x) in pairs)
    batch = _padded_batch([[*SYSTEM, 1, 2, 3], [*SYSTEM, 7]])
    for row, prompt in enumerate([[*SYSTEM, 1, 2, 3], [*SYSTEM, 7]]):
        kept = batch.row_kv(row)
        assert kept[0][0].data_ptr() != batch.layer_tensors()[0][0].data_ptr()
        pairs = zip(kept, kv_of(prompt), strict=True)
        assert all(torch.equal(k, w) and torch.equal(v, x) for (k, v), (w, x) in pairs)
