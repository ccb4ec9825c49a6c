"""A sequence that breaks a step fails alone: every other one generates exactly what it would without it."""

from __future__ import annotations

import pytest
from transformers import LlamaForCausalLM

from shared.errors import InvalidRequest
from shared.protocol import GenerationJob, SamplingSpec, TokenPrompt
from tests.engines import (
    VOCAB,
    batched_engine,
    poisoned_llama,
    request,
    run_to_end,
    run_with_failures,
    tiny_llama,
)
from worker.engine import EngineRequest
from worker.engine.fake import ByteTokenizer
from worker.engine.sequential import SequentialEngine
from worker.requests.limits import ModelLimits
from worker.requests.params import DefaultLayers
from worker.requests.preparation import prepare

GOOD = [
    request("a", [5, 6, 7], max_new_tokens=10),
    request("b", [9, 10, 11, 12, 13, 14, 15, 16, 17], max_new_tokens=10),
    request("c", [20], max_new_tokens=10),
]


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def alone(model: LlamaForCausalLM) -> dict[str, list[int]]:
    """What the good requests generate with nothing else in the batch."""
    return run_to_end(batched_engine(model), GOOD)


def _step_all(engine: object, produced: dict[str, list[int]], failed: set[str]) -> None:
    while engine.has_unfinished():  # type: ignore[attr-defined]
        for update in engine.step():  # type: ignore[attr-defined]
            produced.setdefault(update.request_id, []).extend(update.new_token_ids)
            if update.failed:
                failed.add(update.request_id)


def test_a_prompt_past_the_vocabulary_fails_alone_in_a_shared_prefill(
    model: LlamaForCausalLM, alone: dict[str, list[int]]
) -> None:
    bad = request("bad", [5, VOCAB + 3, 7], max_new_tokens=10)
    produced, failed = run_with_failures(batched_engine(model), [GOOD[0], bad, *GOOD[1:]])
    assert failed == {"bad"}
    assert produced["bad"] == []
    assert {rid: produced[rid] for rid in alone} == alone


def test_a_prompt_failing_in_a_chunk_of_its_prefill_fails_alone(
    model: LlamaForCausalLM, alone: dict[str, list[int]]
) -> None:
    long_bad = request("bad", [1, VOCAB, *range(2, 12)], max_new_tokens=10)  # chunked: 4 tokens a step
    produced, failed = run_with_failures(batched_engine(model, max_prefill_tokens=4), [long_bad, *GOOD])
    assert failed == {"bad"}
    assert {rid: produced[rid] for rid in alone} == alone


def test_a_sequence_whose_sampling_raises_fails_alone_among_decoding_rows(
    model: LlamaForCausalLM, alone: dict[str, list[int]]
) -> None:
    # A bias on an id the model lacks, as a preparation that missed it would pass: sampling raises.
    bad = request("bad", [3, 4], max_new_tokens=10, temperature=0.7, logit_bias=((VOCAB + 1, 5.0),))
    engine = batched_engine(model)
    produced: dict[str, list[int]] = {}
    failed: set[str] = set()
    for good in GOOD:
        engine.add(good)
    for update in engine.step() + engine.step():
        produced.setdefault(update.request_id, []).extend(update.new_token_ids)
    engine.add(bad)  # joins rows that are decoding
    _step_all(engine, produced, failed)
    assert failed == {"bad"}
    assert {rid: produced[rid] for rid in alone} == alone


def test_a_decode_forward_failing_after_it_wrote_the_cache_costs_the_other_rows_nothing(
    alone: dict[str, list[int]],
) -> None:
    poison = 77
    assert all(poison not in tokens for tokens in alone.values())  # only the poisoned row ever feeds it
    # The row's first token is the poison (biased from its prefill); its next decode forward fails
    # after every layer appended its column to the shared cache.
    poisoned = request("poisoned", [40, 41], max_new_tokens=10, logit_bias=((poison, 100.0),))
    engine = batched_engine(poisoned_llama(poison))
    produced: dict[str, list[int]] = {}
    failed: set[str] = set()
    for good in GOOD:
        engine.add(good)
    for _ in range(3):  # the rows have a history in the cache by the time the poisoned one joins
        for update in engine.step():
            produced.setdefault(update.request_id, []).extend(update.new_token_ids)
    engine.add(poisoned)
    _step_all(engine, produced, failed)
    assert failed == {"poisoned"}
    assert produced["poisoned"] == [poison]  # its prefill ran; the decode after it failed
    assert {rid: produced[rid] for rid in alone} == alone


def test_the_per_sequence_engine_fails_a_bad_prompt_alone(model: LlamaForCausalLM) -> None:
    bad = request("bad", [5, VOCAB + 3, 7], max_new_tokens=10)
    produced, failed = run_with_failures(SequentialEngine(model, max_batch_size=8), [bad, *GOOD])
    without = run_to_end(SequentialEngine(model, max_batch_size=8), GOOD)
    assert failed == {"bad"}
    assert {rid: produced[rid] for rid in without} == without


def test_preparation_refuses_an_id_past_the_models_vocabulary_before_the_engine(
    model: LlamaForCausalLM,
) -> None:
    limits = ModelLimits(512, frozenset(), vocab_size=int(model.config.vocab_size), max_num_beams=4)
    job = GenerationJob(
        request_id="r", model="tiny", prompt=TokenPrompt(token_ids=[5, VOCAB]), created_at=0.0
    )
    with pytest.raises(InvalidRequest) as raised:
        prepare(job, ByteTokenizer(), DefaultLayers(SamplingSpec(), SamplingSpec()), limits)
    assert raised.value.param == "prompt"
    # One id lower is the model's last: preparation lets it through and the engine runs it.
    last = job.model_copy(update={"prompt": TokenPrompt(token_ids=[5, VOCAB - 1])})
    prepared = prepare(last, ByteTokenizer(), DefaultLayers(SamplingSpec(), SamplingSpec()), limits)
    engine_request: EngineRequest = prepared.engine_request
    produced, failed = run_with_failures(batched_engine(model), [engine_request])
    assert failed == set() and len(produced["r"]) == engine_request.max_new_tokens


def test_prompts_sharing_a_prefix_past_the_vocabulary_fail_alone_with_the_prefix_cache_on(
    model: LlamaForCausalLM, alone: dict[str, list[int]]
) -> None:
    shared = [1, 2, 3, VOCAB + 9, 4, 5, 6, 7, 8, 9]  # long enough to be computed once for the burst
    bad = [request("bad-1", [*shared, 10]), request("bad-2", [*shared, 11, 12])]
    produced, failed = run_with_failures(batched_engine(model, prefix_cache_tokens=4096), [*bad, *GOOD])
    assert failed == {"bad-1", "bad-2"}
    assert {rid: produced[rid] for rid in alone} == alone
