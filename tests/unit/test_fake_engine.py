from __future__ import annotations

from collections.abc import Iterable

import pytest

from shared.protocol import FinishReason
from worker.engine import Engine, EngineRequest, SamplingParams, SequenceUpdate
from worker.engine.fake import EOS_TOKEN_ID, ByteTokenizer, FakeEngine
from worker.requests.tokenization import Tokenizer

SCRIPT = "héllo"  # 6 bytes: the é is two tokens
SCRIPT_IDS = list(SCRIPT.encode())
EOS = frozenset({EOS_TOKEN_ID})


def make_request(
    request_id: str = "r1",
    *,
    prompt: Iterable[int] = (1, 2, 3),
    max_new_tokens: int = 100,
    eos: frozenset[int] = EOS,
    sampling: SamplingParams | None = None,
) -> EngineRequest:
    return EngineRequest(request_id, tuple(prompt), sampling or SamplingParams(), max_new_tokens, eos)


def run_to_completion(engine: FakeEngine, max_steps: int = 1000) -> dict[str, list[SequenceUpdate]]:
    updates: dict[str, list[SequenceUpdate]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return updates
        for update in engine.step():
            updates.setdefault(update.request_id, []).append(update)
    raise AssertionError("engine did not finish")


def tokens_of(updates: list[SequenceUpdate]) -> list[int]:
    return [token_id for update in updates for token_id in update.new_token_ids]


def generate(request: EngineRequest, script: str = SCRIPT) -> list[SequenceUpdate]:
    engine = FakeEngine(script)
    engine.add(request)
    return run_to_completion(engine)[request.request_id]


def test_fake_engine_and_byte_tokenizer_fit_the_protocols() -> None:
    engine: Engine = FakeEngine(SCRIPT)
    tokenizer: Tokenizer = ByteTokenizer()

    assert engine.has_unfinished() is False
    assert tokenizer.eos_token_ids == EOS


def test_byte_tokenizer_round_trips_and_drops_eos() -> None:
    tokenizer = ByteTokenizer()

    ids = tokenizer.encode("añ 👋", add_special_tokens=True)

    assert ids == list("añ 👋".encode())
    assert tokenizer.decode([*ids, EOS_TOKEN_ID]) == "añ 👋"
    assert tokenizer.decode(ids[:2]) == "a\ufffd"


def test_greedy_generates_the_script_then_eos_and_stops() -> None:
    updates = generate(make_request())

    assert tokens_of(updates) == [*SCRIPT_IDS, EOS_TOKEN_ID]
    assert [u.finish_reason for u in updates] == [None] * len(SCRIPT_IDS) + [FinishReason.STOP]
    assert all(len(u.new_token_ids) == 1 for u in updates)


def test_same_request_gives_the_same_tokens_every_time() -> None:
    sampled = SamplingParams(temperature=0.8, seed=1234)

    first = tokens_of(generate(make_request(sampling=sampled)))
    second = tokens_of(generate(make_request(sampling=sampled)))

    assert first == second
    assert len(first) == len(SCRIPT_IDS) + 1


def test_sampling_starts_at_an_offset_from_the_seed_or_the_prompt() -> None:
    script = "abcdefghijklmnopqrstuvwxyz"

    def first_token(prompt: tuple[int, ...], seed: int | None) -> int:
        sampling = SamplingParams(temperature=1.0, seed=seed)
        return generate(make_request(prompt=prompt, sampling=sampling), script)[0].new_token_ids[0]

    by_seed = {first_token((1, 2), seed) for seed in range(10)}
    by_prompt = {first_token(prompt, None) for prompt in [(1,), (2,), (3, 4), (5, 6, 7)]}

    assert len(by_seed) > 1
    assert len(by_prompt) > 1
    assert first_token((1,), 42) == first_token((9, 9, 9), 42)  # the seed decides, not the prompt


def test_eos_counts_towards_max_new_tokens_and_wins_over_length() -> None:
    updates = generate(make_request(max_new_tokens=len(SCRIPT_IDS) + 1))

    assert tokens_of(updates)[-1] == EOS_TOKEN_ID
    assert updates[-1].finish_reason is FinishReason.STOP


def test_max_new_tokens_finishes_with_length() -> None:
    updates = generate(make_request(max_new_tokens=3))

    assert tokens_of(updates) == SCRIPT_IDS[:3]
    assert updates[-1].finish_reason is FinishReason.LENGTH


def test_ignore_eos_keeps_cycling_until_length() -> None:
    updates = generate(make_request(max_new_tokens=15, eos=frozenset()))

    assert tokens_of(updates) == (SCRIPT_IDS * 3)[:15]
    assert updates[-1].finish_reason is FinishReason.LENGTH


def test_min_new_tokens_holds_eos_off_until_reached() -> None:
    updates = generate(make_request(sampling=SamplingParams(min_new_tokens=8)))

    assert tokens_of(updates) == [*(SCRIPT_IDS * 2)[:8], EOS_TOKEN_ID]
    assert updates[-1].finish_reason is FinishReason.STOP


def test_abort_of_running_and_waiting_requests_stops_their_updates() -> None:
    engine = FakeEngine(SCRIPT, max_batch_size=1)
    engine.add(make_request("running"))
    engine.add(make_request("waiting"))
    engine.add(make_request("kept"))
    assert [u.request_id for u in engine.step()] == ["running"]

    engine.abort("running")
    engine.abort("waiting")
    engine.abort("unknown")
    updates = run_to_completion(engine)

    assert set(updates) == {"kept"}
    assert engine.has_unfinished() is False


def test_batch_is_capped_and_waiting_requests_join_in_fifo_order() -> None:
    engine = FakeEngine(SCRIPT, max_batch_size=2)
    engine.add(make_request("a", max_new_tokens=2))
    engine.add(make_request("b", max_new_tokens=4))
    engine.add(make_request("c", max_new_tokens=2))
    engine.add(make_request("d", max_new_tokens=2))

    steps = [[u.request_id for u in engine.step()] for _ in range(5)]

    assert steps == [["a", "b"], ["a", "b"], ["b", "c"], ["b", "c"], ["d"]]


def test_a_request_gives_the_same_tokens_alone_or_in_a_batch() -> None:
    sampled = SamplingParams(temperature=0.7, seed=7)
    alone = tokens_of(generate(make_request("x", sampling=sampled)))

    engine = FakeEngine(SCRIPT, max_batch_size=2)
    engine.add(make_request("other", max_new_tokens=3))
    engine.add(make_request("x", sampling=sampled))
    engine.add(make_request("third", sampling=SamplingParams(temperature=1.0)))
    crowded = run_to_completion(engine)

    assert tokens_of(crowded["x"]) == alone
    assert set(crowded) == {"other", "x", "third"}


def test_step_without_work_returns_nothing_and_close_drops_everything() -> None:
    engine = FakeEngine(SCRIPT, step_delay_s=10.0)
    assert engine.step() == []  # no sleep either: this test would take 10 s

    engine.add(make_request())
    engine.close()

    assert engine.has_unfinished() is False


def test_duplicate_request_id_is_refused() -> None:
    engine = FakeEngine(SCRIPT)
    engine.add(make_request("dup"))

    with pytest.raises(ValueError, match="already"):
        engine.add(make_request("dup"))
