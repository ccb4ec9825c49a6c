"""Worker side of n and logprobs: choice requests, per-choice events, and logprobs from every engine."""

from __future__ import annotations

import pytest
import torch

from shared.protocol import ChoiceFinished, Delta, Finished, FinishReason
from tests.engines import batched_engine, request, run_to_end, tiny_llama
from worker.engine import EngineRequest, SamplingParams, SequenceUpdate
from worker.engine.fake import ByteTokenizer, FakeEngine, fake_score
from worker.engine.sequential import SequentialEngine
from worker.requests.choices import RequestChoices, choice_requests


def updates_of(engine: FakeEngine | object, requests: list[EngineRequest]) -> list[SequenceUpdate]:
    for r in requests:
        engine.add(r)  # type: ignore[attr-defined]
    updates: list[SequenceUpdate] = []
    while engine.has_unfinished():  # type: ignore[attr-defined]
        updates += engine.step()  # type: ignore[attr-defined]
    return updates


def test_choice_requests_get_their_own_ids_and_consecutive_seeds() -> None:
    base = request("r", [1, 2], temperature=1.0, seed=10)
    choices = choice_requests(base, 3)
    assert [c.request_id for c in choices] == ["r", "r#1", "r#2"]
    assert [c.sampling.seed for c in choices] == [10, 11, 12]
    assert choice_requests(request("u", [1]), 2)[1].sampling.seed is None


def test_choices_end_one_by_one_and_the_request_once_with_summed_usage() -> None:
    tokenizer = ByteTokenizer()
    requests = choice_requests(request("r", [104, 105], max_new_tokens=3, temperature=1.0, seed=1), 2)
    choices = RequestChoices.start(tokenizer, requests, ())
    index_of = {r.request_id: i for i, r in enumerate(requests)}
    events = [
        event
        for update in updates_of(FakeEngine("abcdefgh"), list(requests))
        for event in choices.consume(index_of[update.request_id], update)
    ]
    ended = [event.index for event in events if isinstance(event, ChoiceFinished)]
    assert sorted(ended) == [0, 1]
    assert isinstance(events[-1], Finished)
    assert [event.type for event in events].count("finished") == 1
    assert events[-1].usage.prompt_tokens == 2 and events[-1].usage.completion_tokens == 6
    texts = {i: "".join(e.text for e in events if isinstance(e, Delta) and e.index == i) for i in (0, 1)}
    assert texts[0] != texts[1] and all(len(text) == 3 for text in texts.values())


def test_fake_logprobs_are_deterministic_and_ride_with_their_text() -> None:
    tokenizer = ByteTokenizer()
    engine_request = request("r", [65, 66], max_new_tokens=4, eos=[256])
    engine_request = EngineRequest(**{**_fields(engine_request), "logprobs": 2, "prompt_logprobs": 1})
    choices = RequestChoices.start(tokenizer, (engine_request,), ())
    events = [e for u in updates_of(FakeEngine("é!"), [engine_request]) for e in choices.consume(0, u)]
    deltas = [e for e in events if isinstance(e, Delta)]
    logprobs = [entry for delta in deltas for entry in delta.logprobs or []]
    # "é" is two byte tokens: its first byte's logprob waits for the second, and both go with "é";
    # the first delta carries the prompt's logprobs only; the EOS's goes out last, with no text.
    assert [(d.text, len(d.logprobs or [])) for d in deltas] == [("", 0), ("é", 2), ("!", 1), ("", 1)]
    assert [entry.logprob for entry in logprobs] == [fake_score(t, 2).logprob for t in [*"é!".encode(), 256]]
    assert all(entry.top[0].token_id == entry.token_id and len(entry.top) == 2 for entry in logprobs)
    prompt = deltas[0].prompt_logprobs
    assert prompt is not None and [(p.token, p.logprob is None) for p in prompt] == [
        ("A", True),
        ("B", False),
    ]


def _fields(engine_request: EngineRequest) -> dict[str, object]:
    return {name: getattr(engine_request, name) for name in EngineRequest.__dataclass_fields__}


@pytest.fixture(scope="module")
def model() -> object:
    return tiny_llama()


def _scored(prompt: list[int], **extra: object) -> EngineRequest:
    return EngineRequest(
        request_id="s",
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(),
        max_new_tokens=3,
        eos_token_ids=frozenset(),
        logprobs=3,
        prompt_logprobs=2,
        **extra,  # type: ignore[arg-type]
    )


def test_greedy_token_is_the_top_alternative_with_the_raw_log_softmax(model: object) -> None:
    prompt = [5, 9, 17, 3]
    updates = updates_of(batched_engine(model), [_scored(prompt)])  # type: ignore[arg-type]
    first = updates[0]
    assert first.logprobs is not None and len(first.logprobs) == 1
    score = first.logprobs[0]
    assert score.top[0][0] == score.token_id and len(score.top) == 3
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0]  # type: ignore[operator]
    expected = torch.log_softmax(logits.float(), dim=-1)
    assert score.logprob == pytest.approx(float(expected[-1, score.token_id]), abs=1e-4)
    assert first.prompt_logprobs is not None and first.prompt_logprobs[0] is None
    for position, entry in enumerate(first.prompt_logprobs[1:], start=1):
        assert entry is not None and entry.token_id == prompt[position]
        assert entry.logprob == pytest.approx(float(expected[position - 1, prompt[position]]), abs=1e-4)


def test_prompt_logprobs_agree_across_whole_chunked_batched_and_sequential_prefill(model: object) -> None:
    prompt = [7, 1, 30, 2, 8, 44, 9]

    def prompt_scores(engine: object) -> list[float]:
        first = updates_of(engine, [_scored(prompt)])[0]
        return [s.logprob for s in first.prompt_logprobs or () if s is not None]

    whole = prompt_scores(batched_engine(model))  # type: ignore[arg-type]
    chunked = prompt_scores(batched_engine(model, max_prefill_tokens=3))  # type: ignore[arg-type]
    sequential = prompt_scores(SequentialEngine(model, max_batch_size=4))  # type: ignore[arg-type]
    assert len(whole) == len(prompt) - 1
    assert chunked == pytest.approx(whole, abs=1e-4)
    assert sequential == pytest.approx(whole, abs=1e-4)


def test_logprobs_do_not_change_the_tokens(model: object) -> None:
    plain = request("s", [4, 5, 6], max_new_tokens=3)
    tokens = run_to_end(batched_engine(model), [plain])["s"]  # type: ignore[arg-type]
    scored = updates_of(batched_engine(model), [_scored([4, 5, 6])])  # type: ignore[arg-type]
    assert [u.new_token_ids[0] for u in scored] == tokens
    assert all(u.finish_reason in (None, FinishReason.LENGTH) for u in scored)
