"""The direct forward: Llama-family models decode and prefill over their own modules, with their
forward's logits and cache, bit for bit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from unittest import mock

import pytest
import torch
from transformers import (
    DynamicCache,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from shared.settings import WorkerSettings
from tests.engines import VOCAB, batched_engine, request, run_to_end, scripted_llama, tiny_llama
from worker.engine import EngineRequest
from worker.engine.decode_attention import use_decode_attention
from worker.engine.direct_forward import DirectForward, PromptForward, _unserved_because
from worker.engine.hf import MIXED_PROMPT_TOKENS, TransformersEngine
from worker.engine.kv_cache import prefill_layout
from worker.model.backend import prepare_model

PROMPTS = {"a": [5, 6, 7], "b": [9, 10, 11, 12, 13, 14, 15, 16, 17], "c": [20], "d": [30, 31, 32, 33, 34]}
# Small shapes of each family; head_dim 64 reaches the attention kernel's vector paths.
_SHAPE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
}


def _mistral() -> MistralForCausalLM:
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(**_SHAPE, sliding_window=None)).eval()


def _qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    # Qwen2's projections carry biases: the fused product keeps them.
    return Qwen2ForCausalLM(Qwen2Config(**_SHAPE)).eval()


def _qwen3() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    # Qwen3 normalizes each head's queries and keys before the rotation.
    return Qwen3ForCausalLM(Qwen3Config(**{**_SHAPE, "head_dim": 64})).eval()


FAMILIES: dict[str, Callable[[], PreTrainedModel]] = {
    "llama": tiny_llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
}


def _as_served(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """The model in ``dtype`` with the worker's CPU changes: fused projections, packed Linears."""
    model = model.to(dtype)
    prepare_model(model, WorkerSettings(dtype="float32" if dtype == torch.float32 else "bfloat16"))
    return model


def _decoding(engine: TransformersEngine, steps: int = 3) -> TransformersEngine:
    """``engine`` with ``PROMPTS`` prefilled and decoding, rows of different lengths."""
    for rid, prompt in PROMPTS.items():
        engine.add(request(rid, prompt, max_new_tokens=50))
    for _ in range(steps):
        engine.step()
    return engine


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_direct_step_gives_the_model_forwards_logits_bit_for_bit(family: str, dtype: torch.dtype) -> None:
    engine = _decoding(batched_engine(_as_served(FAMILIES[family](), dtype)))
    assert engine._direct is not None
    kv, last = engine._kv, [row.token_ids[-1] for row in engine._rows]
    assert kv is not None
    with torch.inference_mode():
        direct = engine._direct.logits(kv, last)
        kv.abandon()  # the same step again, through the model's forward
        engine._direct, saved = None, engine._direct
        forward = engine._decode_forward(kv)
    assert torch.equal(direct, forward)
    assert saved is not None


def _prefill_both_ways(
    engine: TransformersEngine,
    ids: torch.Tensor,
    mask: torch.Tensor | None,
    positions: torch.Tensor,
    keep: int,
    caches: tuple[DynamicCache, DynamicCache],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same prefill through the direct forward (into ``caches[0]``) and the model's (``caches[1]``)."""
    assert engine._direct is not None
    with torch.inference_mode():
        direct = engine._direct.prefill_logits(ids, mask, positions, caches[0], keep)
        forward = engine._model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=caches[1],
            use_cache=True,
            logits_to_keep=keep,
        ).logits
    return direct, forward


def _same_cache(one: DynamicCache, other: DynamicCache) -> bool:
    return all(
        torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        for a, b in zip(one.layers, other.layers, strict=True)
    )


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# The last position's logits (to sample), every position's (prompt logprobs).
@pytest.mark.parametrize("keep", [1, 0])
def test_a_direct_prefill_gives_the_model_forwards_logits_and_cache_bit_for_bit(
    family: str, dtype: torch.dtype, keep: int
) -> None:
    model = _as_served(FAMILIES[family](), dtype)
    engine = batched_engine(model)
    config = model.config
    # Two prompts padded into one forward, as the engine prefills prompts together.
    ids, mask = (torch.tensor(rows) for rows in prefill_layout([0, 0], [tuple(range(5, 75)), (9, 10, 11)]))
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    caches = DynamicCache(config=config), DynamicCache(config=config)
    direct, forward = _prefill_both_ways(engine, ids, mask, positions, keep, caches)
    assert direct.shape == forward.shape and torch.equal(direct, forward)
    assert _same_cache(*caches)
    # A long prompt's next chunk, over the first chunk's cache (no padding: no mask).
    caches = DynamicCache(config=config), DynamicCache(config=config)
    for start, stop in [(0, 40), (40, 67)]:
        chunk = torch.arange(start + 3, stop + 3).unsqueeze(0)
        positions = torch.arange(start, stop).unsqueeze(0)
        direct, forward = _prefill_both_ways(engine, chunk, None, positions, keep, caches)
        assert torch.equal(direct, forward)
    assert _same_cache(*caches)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_tokens_are_the_same_with_and_without_the_direct_step(family: str) -> None:
    model = _as_served(FAMILIES[family](), torch.bfloat16)
    requests = [request(rid, prompt, max_new_tokens=24) for rid, prompt in PROMPTS.items()]
    direct = batched_engine(model)
    forward = TransformersEngine(model, direct._scheduler.limits, direct_forward=False)
    assert direct._direct is not None and forward._direct is None
    assert run_to_end(direct, requests) == run_to_end(forward, requests)


def test_decode_steps_and_prefills_do_not_call_the_models_forward() -> None:
    model = tiny_llama()
    engine = batched_engine(model)
    with mock.patch.object(
        LlamaForCausalLM, "forward", autospec=True, side_effect=LlamaForCausalLM.forward
    ) as spy:
        first = _decoding(engine, steps=1)  # every prompt prefills in this step
        updates = engine.step()
    assert first._rows and len(updates) == len(PROMPTS) and spy.call_count == 0


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        # A subclass: its forward is its own.
        (lambda: scripted_llama(3, [7, 8]), "not one of the model classes"),
        (lambda: _hooked(tiny_llama()), "replaced or hooked"),
    ],
)
def test_models_it_does_not_implement_keep_their_forward_with_a_log_line(
    make: Callable[[], PreTrainedModel], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="worker.engine.direct_forward"):
        engine = batched_engine(make())
    assert engine._direct is None
    assert reason in caplog.text
    assert run_to_end(engine, [request("a", PROMPTS["a"], max_new_tokens=4)])["a"]


def test_sliding_window_attention_is_left_to_the_models_forward() -> None:
    # The batched engine serves no such model (``PaddedKVCache.supports``); the step refuses it anyway.
    model = MistralForCausalLM(MistralConfig(**_SHAPE, sliding_window=64)).eval()
    assert use_decode_attention(model)
    assert _unserved_because(model) == "sliding-window attention"
    assert DirectForward.build(model) is None


def test_a_model_on_the_matmul_attention_decodes_directly_with_the_same_tokens() -> None:
    model = tiny_llama()
    requests = [request(rid, prompt) for rid, prompt in PROMPTS.items()]
    matmuls = batched_engine(model, use_cpu_kernels=False)
    assert matmuls._direct is not None
    produced = run_to_end(matmuls, requests)
    limits = matmuls._scheduler.limits
    forward = TransformersEngine(model, limits, use_cpu_kernels=False, direct_forward=False)
    assert produced == run_to_end(forward, requests)


def _hooked(model: PreTrainedModel) -> PreTrainedModel:
    model.model.layers[0].register_forward_hook(lambda module, args, output: None)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_one_call_decode_attention_writes_and_attends_as_the_layers_ops(
    family: str, dtype: torch.dtype
) -> None:
    engine = _decoding(batched_engine(_as_served(FAMILIES[family](), dtype)))
    direct, kv = engine._direct, engine._kv
    assert direct is not None and kv is not None
    one_call = direct._append_and_attend
    assert one_call is not None, "the kernels are built here: the one-call path must be chosen"
    last = [row.token_ids[-1] for row in engine._rows]
    calls = mock.Mock(side_effect=one_call)
    with torch.inference_mode():
        direct._append_and_attend = calls
        fused = direct.logits(kv, last)
        fused_cache = [(keys.clone(), kv.values[index].clone()) for index, keys in enumerate(kv.keys)]
        kv.abandon()
        direct._append_and_attend = None  # the same step through the layers' ops
        layered = direct.logits(kv, last)
    assert calls.call_count == len(kv.keys)
    assert torch.equal(fused, layered)
    for (keys, values), (fused_keys, fused_values) in zip(
        zip(kv.keys, kv.values, strict=True), fused_cache, strict=True
    ):
        assert torch.equal(keys, fused_keys) and torch.equal(values, fused_values)


def test_the_one_call_decode_attention_is_not_used_for_per_head_norms() -> None:
    engine = batched_engine(_as_served(_qwen3(), torch.float32))
    assert engine._direct is not None and engine._direct._append_and_attend is None


def _staggered(
    engine: TransformersEngine, arrivals: dict[int, list[EngineRequest]]
) -> tuple[dict[str, list[int]], set[str]]:
    """Each request's tokens and the ids that failed, ``arrivals[step]`` added before that step."""
    produced: dict[str, list[int]] = {}
    failed: set[str] = set()
    step = 0
    while engine.has_unfinished() or step <= max(arrivals):
        for new in arrivals.get(step, []):
            produced[new.request_id] = []
            engine.add(new)
        for update in engine.step():
            produced[update.request_id] += update.new_token_ids
            if update.failed:
                failed.add(update.request_id)
        step += 1
    return produced, failed


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("keep", [1, 0])
def test_a_decode_step_with_prompts_beside_it_gives_each_its_own_logits_and_cache(
    family: str, dtype: torch.dtype, keep: int
) -> None:
    model = _as_served(FAMILIES[family](), dtype)
    engine = _decoding(batched_engine(model))
    direct, kv = engine._direct, engine._kv
    assert direct is not None and kv is not None and direct.mixes
    last = [row.token_ids[-1] for row in engine._rows]
    # Two new prompts padded into one forward, as the engine prefills prompts together.
    ids, mask = (torch.tensor(rows) for rows in prefill_layout([0, 0], [tuple(range(5, 45)), (9, 10, 11)]))
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    caches = DynamicCache(config=model.config), DynamicCache(config=model.config)
    with torch.inference_mode():
        both = direct.mixed_logits(kv, last, PromptForward(ids, mask, positions, caches[0], keep))
        assert both is not None
        mixed_cache = [(keys.clone(), kv.values[index].clone()) for index, keys in enumerate(kv.keys)]
        kv.abandon()  # the same step, then the same prefill, apart
        step = direct.logits(kv, last)
        prefill = direct.prefill_logits(ids, mask, positions, caches[1], keep)
    # Each token's products run among other rows: equal up to the products' summation order.
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    assert both[0].shape == step.shape and both[1].shape == prefill.shape
    torch.testing.assert_close(both[0], step, **tolerance)
    torch.testing.assert_close(both[1], prefill, **tolerance)
    assert torch.equal(both[0].argmax(-1), step.argmax(-1))
    for index, (keys, values) in enumerate(mixed_cache):
        torch.testing.assert_close(keys, kv.keys[index], **tolerance)
        torch.testing.assert_close(values, kv.values[index], **tolerance)
    for mixed_layer, apart_layer in zip(caches[0].layers, caches[1].layers, strict=True):
        torch.testing.assert_close(mixed_layer.keys, apart_layer.keys, **tolerance)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_prompts_arriving_while_rows_decode_share_their_forward_with_the_same_greedy_tokens(
    family: str,
) -> None:
    model = _as_served(FAMILIES[family](), torch.float32)
    ids = iter(PROMPTS)
    # Prompts arrive while others decode: each step after the first has rows and a prompt or two.
    arrivals = {0: [request(next(ids), PROMPTS["a"], max_new_tokens=12)]}
    arrivals[2] = [
        request(next(ids), PROMPTS["b"], max_new_tokens=9),
        request(next(ids), PROMPTS["c"], max_new_tokens=7),
    ]
    arrivals[3] = [replace(request(next(ids), PROMPTS["d"], max_new_tokens=10), prompt_logprobs=2)]
    engine = batched_engine(model)
    assert engine._direct is not None
    with mock.patch.object(engine._direct, "mixed_logits", side_effect=engine._direct.mixed_logits) as mixed:
        produced, failed = _staggered(engine, arrivals)
    apart = TransformersEngine(model, engine._scheduler.limits, direct_forward=False)
    assert mixed.call_count == 2 and not failed
    assert produced == _staggered(apart, arrivals)[0]
    assert engine._kv is None  # every row left


def test_a_bad_prompt_beside_decoding_rows_fails_alone_and_the_rows_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _as_served(tiny_llama(), torch.float32)
    good = [request("a", PROMPTS["a"], max_new_tokens=12), request("d", PROMPTS["d"], max_new_tokens=12)]
    alone, _ = _staggered(batched_engine(model), {0: good})
    bad = request("bad", [5, VOCAB + 3, 7], max_new_tokens=10)
    late = request("c", PROMPTS["c"], max_new_tokens=6)  # a good prompt in the same step as the bad one
    with caplog.at_level(logging.WARNING, logger="worker.engine.hf"):
        produced, failed = _staggered(batched_engine(model), {0: good, 2: [bad, late]})
    assert "running them apart" in caplog.text  # the forward they shared raised: each path again, alone
    assert failed == {"bad"} and produced["bad"] == []
    assert {rid: produced[rid] for rid in alone} == alone
    assert produced["c"] == run_to_end(batched_engine(model), [late])["c"]


def test_a_long_prompt_beside_decoding_rows_prefills_in_a_step_of_its_own() -> None:
    # One forward costs what two do beside a long prompt, and its first token would wait for the
    # rows' decode: the steps alternate.
    model = _as_served(tiny_llama(), torch.float32)
    engine = batched_engine(model)
    assert engine._direct is not None
    long_prompt = [5 + index % 50 for index in range(MIXED_PROMPT_TOKENS + 1)]
    arrivals = {
        0: [request("a", PROMPTS["a"], max_new_tokens=8)],
        2: [request("long", long_prompt, max_new_tokens=4)],
    }
    with mock.patch.object(engine._direct, "mixed_logits", side_effect=engine._direct.mixed_logits) as mixed:
        produced, failed = _staggered(engine, arrivals)
    assert mixed.call_count == 0 and not failed
    assert len(produced["a"]) == 8 and len(produced["long"]) == 4
