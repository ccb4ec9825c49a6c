"""The running batch's slot cache is written in place, keeps each row's KV through joins, leaves and growth,
and its decode attention computes what sdpa does."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    DynamicCache,
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tests.engines import _tiny_config, batched_engine, request, run_to_end, sdpa_reference, tiny_llama
from tests.unit.test_freed_memory import _resident_mb
from worker.engine.decode_attention import ATTENTION_NAME, KERNEL_ATTENTION_NAME, decode_attention_forward
from worker.engine.kv_cache import PaddedKVCache
from worker.engine.sequential import SequentialEngine
from worker.engine.slot_cache import SlotKVCache
from worker.model.freed_memory import return_freed_memory

PROMPTS = {"a": [5, 6, 7], "b": [9, 10, 11, 12, 13, 14, 15, 16, 17], "c": [20]}


def test_decode_steps_write_into_the_same_storage() -> None:
    engine = batched_engine(tiny_llama())
    for rid, prompt in PROMPTS.items():
        engine.add(request(rid, prompt, max_new_tokens=30))
    engine.step()  # prefill: the rows join the slots
    kv = engine._kv
    assert kv is not None
    storage = kv.storage()
    for _ in range(20):
        engine.step()
        assert engine._kv is kv and kv.storage() == storage
    # Each decode step caches the token sampled before it: the prompt plus 20 (prefill groups reorder rows).
    assert sorted(kv.lengths) == sorted(len(prompt) + 20 for prompt in PROMPTS.values())


def test_bf16_decode_steps_on_whole_slots_write_in_place_until_a_row_outgrows_them() -> None:
    # Whole slots are the matmul attention's bf16 layout; the fused kernel reads the narrow view.
    engine = batched_engine(tiny_llama().to(torch.bfloat16), use_cpu_kernels=False)
    for rid, prompt in PROMPTS.items():
        engine.add(request(rid, prompt, max_new_tokens=70))
    engine.step()
    kv = engine._kv
    assert kv is not None and kv.capacity == 64  # whole slots: columns in 64s, not doubled from 256
    storage = kv.storage()
    for _ in range(40):  # the longest row reaches 9 + 40 columns: still inside its 64
        engine.step()
        assert engine._kv is kv and kv.storage() == storage
    for _ in range(20):  # past 64: the storage grows once, by 64 columns
        engine.step()
    assert kv.capacity == 128 and kv.storage() != storage


def test_bf16_decode_steps_through_the_kernel_write_in_place_into_narrow_slots() -> None:
    engine = batched_engine(tiny_llama().to(torch.bfloat16))
    for rid, prompt in PROMPTS.items():
        engine.add(request(rid, prompt, max_new_tokens=40))
    engine.step()
    kv = engine._kv
    assert (
        kv is not None and kv.capacity == 256
    )  # narrow: columns doubled from 256, read up to the longest row
    storage = kv.storage()
    for _ in range(30):
        engine.step()
        assert engine._kv is kv and kv.storage() == storage


def test_the_model_attends_through_the_decode_attention() -> None:
    model = tiny_llama()
    batched_engine(model)
    assert model.config._attn_implementation == KERNEL_ATTENTION_NAME  # make setup built the kernel
    plain = tiny_llama()
    batched_engine(plain, use_cpu_kernels=False)
    assert plain.config._attn_implementation == ATTENTION_NAME


def _padded(rows: list[list[int]], layers: int = 2, heads: int = 2, dim: int = 4) -> PaddedKVCache:
    """A prefill batch whose row ``i`` is real where ``rows[i]`` is 1, with distinct values everywhere."""
    mask = torch.tensor(rows)
    cache = DynamicCache()
    for layer in range(layers):
        shape = (len(rows), heads, mask.shape[1], dim)
        keys = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) + 1000 * layer
        cache.update(keys, -keys, layer)
    return PaddedKVCache(cache, mask)


def _assert_rows_equal(slots: SlotKVCache, row: int, padded: PaddedKVCache, padded_row: int) -> None:
    for (keys, values), (want_keys, want_values) in zip(
        slots.row_kv(row), padded.row_kv(padded_row), strict=True
    ):
        assert torch.equal(keys, want_keys) and torch.equal(values, want_values)


def test_joining_rows_keeps_their_real_columns_only() -> None:
    # The middle row is [padding, prefix, padding, rest], as a prompt on a reused prefix is.
    padded = _padded([[1, 1, 1, 1, 1], [0, 1, 1, 0, 1], [0, 0, 0, 1, 1]])
    slots = SlotKVCache(num_layers=2, max_rows=8)
    slots.join(padded)
    assert slots.lengths == [5, 3, 2]
    for row in range(3):
        _assert_rows_equal(slots, row, padded, row)


def test_joining_unpadded_rows_after_others_keeps_every_row() -> None:
    # Rows without padding (a prompt prefilled alone, or prompts of one length) join by plain copies.
    padded, unpadded = _padded([[0, 1, 1], [1, 1, 1]]), _padded([[1, 1, 1, 1], [1, 1, 1, 1]])
    slots = SlotKVCache(num_layers=2, max_rows=8)
    slots.join(padded)
    slots.join(unpadded)
    assert slots.lengths == [2, 3, 4, 4]
    for row, (batch, batch_row) in enumerate([(padded, 0), (padded, 1), (unpadded, 0), (unpadded, 1)]):
        _assert_rows_equal(slots, row, batch, batch_row)


def test_storage_is_resident_for_the_columns_rows_hold_not_its_capacity() -> None:
    # 64 rows of 3 tokens in slots of 256 columns: 512 MB of capacity, a few MB of it written.
    padded = _padded([[1, 1, 1]] * 64, layers=4, heads=8, dim=128)
    slots = SlotKVCache(num_layers=4, max_rows=64)
    before = _resident_mb()
    slots.join(padded)
    capacity_mb = sum(t.numel() * t.element_size() for t in slots.keys + slots.values) / 2**20
    assert capacity_mb >= 512
    assert _resident_mb() - before < 64
    for keys, values in zip(slots.keys, slots.values, strict=True):
        # Past the rows' lengths the storage reads as zeros (a masked column must not carry a NaN).
        assert not keys[:, :, 3:].any() and not values[:, :, 3:].any()
    return_freed_memory()  # what the reads' temporaries left in the C heap
    assert _resident_mb() - before < 64  # reading untouched columns costs no memory either
    _assert_rows_equal(slots, 63, padded, 63)


def test_slots_that_rows_leave_give_their_pages_back_and_read_as_zeros_again() -> None:
    # 64 rows of 200 tokens: 100 MB of KV written; the 48 that leave free three quarters of it.
    padded = _padded([[1] * 200] * 64, layers=2, heads=8, dim=128)
    slots = SlotKVCache(num_layers=2, max_rows=64)
    slots.join(padded)
    del padded
    return_freed_memory()
    kept = [slots.row_kv(row) for row in (0, 5, 15)]
    held = _resident_mb()
    slots.keep(list(range(16)))  # the last 48 rows leave (their requests finished)
    assert held - _resident_mb() > 60
    for keys, values in zip(slots.keys, slots.values, strict=True):
        assert not keys[16:].any() and not values[16:].any()  # a row joining there finds zeros
    slots.keep(SlotKVCache.compacted([0, 5, 15]))  # rows from the middle leave: the last moves down
    assert slots.lengths == [200, 200, 200]
    assert not slots.keys[0][3:].any() and not slots.values[1][3:].any()
    for slot, want in enumerate(kept):  # rows 5 and 15 moved down to slots 1 and 2
        for (keys, values), (want_keys, want_values) in zip(slots.row_kv(slot), want, strict=True):
            assert torch.equal(keys, want_keys) and torch.equal(values, want_values)


def test_rows_survive_growth_and_leaving_rows() -> None:
    first, second = _padded([[1, 1, 1], [0, 1, 1]]), _padded([[1, 1, 1, 1]])
    slots = SlotKVCache(num_layers=2, max_rows=8)
    slots.join(first)
    before = slots.storage()
    slots._reserve(rows=5, columns=600)  # more rows and columns than held: the storage grows
    assert slots.storage() != before and slots.capacity >= 600 and slots.slot_count >= 5
    slots.join(second)
    slots.keep([2, 0])  # the second row leaves; the others move down, in this order
    assert slots.lengths == [4, 3]
    _assert_rows_equal(slots, 0, second, 0)
    _assert_rows_equal(slots, 1, first, 0)


def test_a_leaving_rows_slot_takes_the_last_row_and_the_others_stay() -> None:
    batches = [_padded([[1, 1, 1]]), _padded([[0, 1, 1, 1]]), _padded([[1, 1, 1, 1, 1]]), _padded([[1, 1]])]
    slots = SlotKVCache(num_layers=2, max_rows=8)
    for batch in batches:
        slots.join(batch)
    assert SlotKVCache.compacted([0, 2, 3]) == [0, 3, 2]  # row 1 leaves: row 3 fills its slot
    assert SlotKVCache.compacted([1, 2]) == [2, 1]  # row 1 stays where it is
    assert SlotKVCache.compacted([0, 1, 2]) == [0, 1, 2]
    slots.keep(SlotKVCache.compacted([0, 2, 3]))
    assert slots.lengths == [3, 2, 5]
    for slot, batch in enumerate([batches[0], batches[3], batches[2]]):
        _assert_rows_equal(slots, slot, batch, 0)


def test_a_step_on_fixed_columns_and_bound_inputs_decodes_as_the_plain_step() -> None:
    # What a CUDA graph replays (``graphed_decode.py``): idle rows, the columns widened to a bucket,
    # the step's inputs copied into tensors of the graph's own and bound to the cache.
    model = tiny_llama()
    batched_engine(model)  # switches the model to the decode attention
    prompt = torch.tensor([[3, 4, 5, 6], [2, 7, 8, 9]])
    logits = []
    for fixed in (False, True):
        cache = DynamicCache(config=model.config)
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        slots = SlotKVCache(num_layers=2, max_rows=8)
        slots.join(PaddedKVCache(cache, torch.ones_like(prompt)))
        generation = slots.generation
        if fixed:
            positions, mask = slots.begin_decode(batch=4, columns=256)
            assert mask.shape == (4, 1, 1, 256) and slots.generation > generation  # the storage grew
            bound_positions, bound_mask = positions[:, 0].clone(), mask.clone()
            slots.bind_step(bound_positions, torch.arange(4), bound_mask)
            ids = torch.tensor([[10], [11], [0], [0]])
        else:
            positions, mask = slots.begin_decode()
            ids = torch.tensor([[10], [11]])
        output = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=slots, use_cache=True
        )
        slots.advance()
        assert slots.lengths == [5, 5]
        logits.append(output.logits[:2, -1])
    torch.testing.assert_close(logits[1], logits[0])


def test_whole_slots_are_read_contiguous_and_sized_to_the_longest_row() -> None:
    # What half-precision steps on CPU read (oneDNN copies a strided operand): whole, tight slots.
    padded = _padded([[1] * 200, [0] * 190 + [1] * 10])
    slots = SlotKVCache(num_layers=2, max_rows=8, whole_slots=True)
    slots.join(padded)
    _, mask = slots.begin_decode()
    assert slots.capacity == 256 and mask.shape[-1] == 256  # 201 columns, rounded up to 64s
    new = torch.zeros(2, 2, 1, 4)
    keys, values = slots.update(new, new, 0)
    assert keys.is_contiguous() and values.is_contiguous()
    slots.advance()
    slots.keep([1])  # the longest row leaves: its columns go with it
    assert slots.lengths == [11] and slots.capacity == 64
    for (keys, values), (want_keys, want_values) in zip(slots.row_kv(0), padded.row_kv(1), strict=True):
        assert torch.equal(keys[:, :10], want_keys) and torch.equal(values[:, :10], want_values)


def test_a_step_over_whole_slots_decodes_as_the_narrow_step_in_bf16() -> None:
    model = tiny_llama().to(torch.bfloat16)
    batched_engine(model)  # switches the model to the decode attention
    prompt = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 0, 2, 7, 8, 9]])
    logits = []
    for whole in (False, True):
        cache = DynamicCache(config=model.config)
        attention_mask = (prompt > 0).long()
        model(input_ids=prompt, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        slots = SlotKVCache(num_layers=2, max_rows=8, whole_slots=whole)
        slots.join(PaddedKVCache(cache, attention_mask))
        positions, mask = slots.begin_decode()
        assert (mask.shape[-1] == slots.capacity) is whole
        output = model(
            input_ids=torch.tensor([[10], [11]]),
            attention_mask=mask,
            position_ids=positions,
            past_key_values=slots,
            use_cache=True,
        )
        logits.append(output.logits[:, -1].float())
    torch.testing.assert_close(logits[1], logits[0], atol=2e-2, rtol=2e-2)


def test_bind_step_refuses_tensors_of_another_shape() -> None:
    slots = SlotKVCache(num_layers=2, max_rows=8)
    slots.join(_padded([[1, 1, 1]]))
    slots.begin_decode(batch=2)
    with pytest.raises(RuntimeError):
        wrong_mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
        slots.bind_step(torch.zeros(2, dtype=torch.long), torch.arange(2), wrong_mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# Small caches and large ones: half-precision rows attend in fp32 copies below SMALL_CACHE_POSITIONS.
@pytest.mark.parametrize(("rows", "columns"), [(1, 40), (4, 40), (9, 40), (20, 40), (20, 200), (1, 1500)])
def test_decode_attention_computes_what_sdpa_does(dtype: torch.dtype, rows: int, columns: int) -> None:
    torch.manual_seed(rows)
    query = torch.randn(rows, 6, 1, 8, dtype=dtype)
    key, value = torch.randn(rows, 2, columns, 8, dtype=dtype), torch.randn(rows, 2, columns, 8, dtype=dtype)
    lengths = torch.randint(1, columns + 1, (rows,))
    mask = (torch.arange(columns)[None, :] < lengths[:, None])[:, None, None, :]
    output, weights = decode_attention_forward(torch.nn.Module(), query, key, value, mask)
    assert weights is None and output.shape == (rows, 1, 6, 8) and output.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        output.float(), sdpa_reference(query, key, value, mask), atol=tolerance, rtol=tolerance
    )


def test_a_model_on_another_attention_keeps_it_and_decodes_the_same() -> None:
    torch.manual_seed(0)
    eager = LlamaForCausalLM._from_config(_tiny_config(), attn_implementation="eager").eval()
    eager.load_state_dict(tiny_llama().state_dict())
    requests = [request(rid, prompt) for rid, prompt in PROMPTS.items()]
    engine = batched_engine(eager)
    assert eager.config._attn_implementation == "eager"  # left alone: the slot mask goes in as floats
    assert run_to_end(engine, requests) == run_to_end(
        SequentialEngine(tiny_llama(), max_batch_size=8), requests
    )


def _tiny(kind: str) -> PreTrainedModel:
    torch.manual_seed(0)
    common = {"vocab_size": 128, "num_hidden_layers": 2, "max_position_embeddings": 256}
    if kind == "gpt2":
        return GPT2LMHeadModel(
            GPT2Config(n_embd=32, n_head=4, n_positions=256, vocab_size=128, n_layer=2)
        ).eval()
    if kind == "qwen2":
        config = Qwen2Config(
            hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, **common
        )
        return Qwen2ForCausalLM(config).eval()
    config = GemmaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        **common,
    )
    return GemmaForCausalLM(config).eval()


@pytest.mark.parametrize("kind", ["gpt2", "qwen2", "gemma"])
def test_other_architectures_decode_in_slots_as_generate_does(kind: str) -> None:
    requests = [request(rid, prompt) for rid, prompt in PROMPTS.items()]
    expected = run_to_end(SequentialEngine(_tiny(kind), max_batch_size=8), requests)
    assert run_to_end(batched_engine(_tiny(kind)), requests) == expected
