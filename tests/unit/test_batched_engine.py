"""The batched transformers engine: sharing forward passes must not change any sequence's output."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import LlamaForCausalLM

from shared.protocol import FinishReason
from tests.engines import batched_engine, request, run_to_end, tiny_llama
from worker.engine import EngineRequest, SamplingParams, SequenceUpdate, TokenScore
from worker.engine.hf import TransformersEngine
from worker.engine.sequential import SequentialEngine
from worker.requests.preparation import BATCH_PRIORITY, INTERACTIVE_PRIORITY

PROMPTS = {"a": [5, 6, 7], "b": [9, 10, 11, 12, 13, 14, 15, 16, 17], "c": [20], "d": [30, 31, 32, 33, 34]}


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama()


def test_greedy_output_alone_equals_output_in_a_batch(model: LlamaForCausalLM) -> None:
    requests = [request(rid, prompt) for rid, prompt in PROMPTS.items()]
    alone = {r.request_id: run_to_end(batched_engine(model), [r])[r.request_id] for r in requests}
    together = run_to_end(batched_engine(model, max_prefill_tokens=4), requests)
    assert together == alone


def test_batched_greedy_matches_the_per_sequence_engine(model: LlamaForCausalLM) -> None:
    requests = [request(rid, prompt) for rid, prompt in PROMPTS.items()]
    sequential = run_to_end(SequentialEngine(model, max_batch_size=8), requests)
    assert run_to_end(batched_engine(model), requests) == sequential


def test_seeded_sampling_is_the_same_whatever_shares_the_batch(model: LlamaForCausalLM) -> None:
    seeded = request("s", PROMPTS["a"], temperature=1.0, top_k=20, seed=11)
    alone = run_to_end(batched_engine(model), [seeded])["s"]
    others = [
        request(rid, prompt, temperature=0.9, seed=i) for i, (rid, prompt) in enumerate(PROMPTS.items())
    ]
    assert run_to_end(batched_engine(model), [*others, seeded])["s"] == alone


def test_stats_report_the_cache_held_against_the_budget(model: LlamaForCausalLM) -> None:
    engine = batched_engine(model, prefix_cache_tokens=100, max_batch_tokens=1000)
    engine.add(request("a", PROMPTS["a"], max_new_tokens=12))
    engine.add(request("b", PROMPTS["b"], max_new_tokens=12))
    engine.step()  # both prefilled: they hold their prompts, 3 and 9 positions
    engine.step()  # one decode: 4 and 10
    stats = engine.stats()
    assert (stats.running, stats.waiting) == (2, 0)
    assert stats.kv_reserved_tokens == 2 * 10  # rows x the longest row held now
    assert stats.kv_capacity_tokens == 1000
    assert stats.kv_held_tokens == 4 + 10  # the tokens themselves: what the cache's memory follows
    assert stats.prefix_cache_tokens == 3 + 9  # both prompts, kept for reuse


def test_a_request_joining_mid_flight_starts_within_one_step(model: LlamaForCausalLM) -> None:
    engine = batched_engine(model)
    engine.add(request("early", PROMPTS["b"], max_new_tokens=50))
    for _ in range(5):
        engine.step()
    engine.add(request("late", PROMPTS["a"], max_new_tokens=3))
    # Its prefill step returns its first token at once; the running row decodes in the next step,
    # with it (prefills and decodes alternate: the row waits one prefill between two tokens).
    first_step = {update.request_id for update in engine.step()}
    assert first_step == {"late"}
    assert {update.request_id for update in engine.step()} == {"early", "late"}


def test_a_prefill_turn_sends_each_groups_first_tokens_in_a_step_of_its_own(model: LlamaForCausalLM) -> None:
    requests = [
        request("long", [(7 * i) % 100 + 1 for i in range(80)], max_new_tokens=6),
        request("short", [40, 41, 42, 43], max_new_tokens=6),
        request("chunked", [(3 * i) % 100 + 1 for i in range(100)], max_new_tokens=6),
    ]
    alone = {r.request_id: run_to_end(batched_engine(model), [r])[r.request_id] for r in requests}
    engine = batched_engine(model, max_prefill_tokens=150)
    engine.add(request("running", PROMPTS["a"], max_new_tokens=30))
    engine.step()  # its prefill
    engine.step()  # a decode step: the next step prefills
    for arriving in requests:
        engine.add(arriving)
    produced: dict[str, list[int]] = {r.request_id: [] for r in requests}
    steps = []
    while engine.has_unfinished():
        updates = engine.step()
        steps.append({update.request_id for update in updates})
        for update in updates:
            if update.request_id in produced:
                produced[update.request_id] += update.new_token_ids
    # The turn's 150 tokens: "long" (80) and "short" (4) finish their prompts, in two forwards (one
    # padded forward of 2 x 80 would cost more), the shortest first, each sent at once; then 66 of
    # "chunked", which gives no token. The running row waits for the whole turn, then decodes.
    assert steps[:4] == [{"short"}, {"long"}, set(), {"running", "short", "long"}]
    assert produced == alone


def _batch_line(request_id: str, prompt: list[int], max_new_tokens: int) -> EngineRequest:
    return replace(request(request_id, prompt, max_new_tokens=max_new_tokens), priority=BATCH_PRIORITY)


def test_an_interactive_prompt_beside_batch_rows_only_prefills_alone_and_they_resume_unchanged(
    model: LlamaForCausalLM,
) -> None:
    batch_lines = [
        replace(request(rid, PROMPTS[rid], max_new_tokens=8), priority=BATCH_PRIORITY) for rid in "bd"
    ]
    alone = run_to_end(batched_engine(model), batch_lines)
    engine = batched_engine(model)
    produced: dict[str, list[int]] = {"b": [], "d": [], "late": []}
    for line in batch_lines:
        engine.add(line)
    for _ in range(3):
        for update in engine.step():
            produced[update.request_id] += update.new_token_ids
    engine.add(replace(request("late", PROMPTS["a"], max_new_tokens=3), priority=INTERACTIVE_PRIORITY))
    first_step = engine.step()
    assert [update.request_id for update in first_step] == ["late"]  # no decode forward of the batch first
    for update in first_step:
        produced[update.request_id] += update.new_token_ids
    while engine.has_unfinished():
        for update in engine.step():
            produced[update.request_id] += update.new_token_ids
    assert {rid: produced[rid] for rid in "bd"} == alone  # the pause changed nothing they generate
    assert len(produced["late"]) == 3


def test_an_interactive_prompt_beside_interactive_rows_does_not_pause_them(model: LlamaForCausalLM) -> None:
    engine = batched_engine(model)
    engine.add(request("streaming", PROMPTS["b"], max_new_tokens=50))
    engine.add(_batch_line("line", PROMPTS["d"], max_new_tokens=50))
    for _ in range(3):
        engine.step()
    engine.add(request("late", PROMPTS["a"], max_new_tokens=3))
    assert {update.request_id for update in engine.step()} == {"late"}  # its prefill, alone
    # Another prompt as urgent as the rows waits for their decode: one prefill between two tokens, never two.
    engine.add(request("later", PROMPTS["c"], max_new_tokens=3))
    assert {update.request_id for update in engine.step()} == {"streaming", "line", "late"}
    assert {update.request_id for update in engine.step()} == {"later"}


def test_abort_frees_the_row_and_leaves_others_untouched(model: LlamaForCausalLM) -> None:
    engine = batched_engine(model)
    keep, drop = (
        request("keep", PROMPTS["a"], max_new_tokens=10),
        request("drop", PROMPTS["b"], max_new_tokens=10),
    )
    engine.add(keep)
    engine.add(drop)
    produced: list[int] = []
    for step in range(10):
        if step == 3:
            engine.abort("drop")
        updates = engine.step()
        assert step <= 3 or all(update.request_id == "keep" for update in updates)
        produced += [t for u in updates if u.request_id == "keep" for t in u.new_token_ids]
    assert not engine.has_unfinished()
    assert produced == run_to_end(batched_engine(model), [keep])["keep"]


def test_batch_size_limit_makes_requests_wait_not_fail(model: LlamaForCausalLM) -> None:
    engine = batched_engine(model, max_batch_size=2)
    requests = [request(rid, prompt, max_new_tokens=4) for rid, prompt in PROMPTS.items()]
    for r in requests:
        engine.add(r)
    finished: dict[str, FinishReason] = {}
    while engine.has_unfinished():
        updates = engine.step()
        assert len({u.request_id for u in updates}) <= 2
        finished |= {u.request_id: u.finish_reason for u in updates if u.finish_reason is not None}
    assert finished == dict.fromkeys(PROMPTS, FinishReason.LENGTH)


def test_token_budget_admits_a_lone_oversized_request(model: LlamaForCausalLM) -> None:
    produced = run_to_end(
        batched_engine(model, max_batch_tokens=2), [request("big", PROMPTS["b"], max_new_tokens=3)]
    )
    assert len(produced["big"]) == 3


def test_eos_ends_with_stop_and_max_tokens_with_length(model: LlamaForCausalLM) -> None:
    greedy = run_to_end(batched_engine(model), [request("g", PROMPTS["d"])])["g"]
    engine = batched_engine(model)
    engine.add(request("eos", PROMPTS["d"], eos=[greedy[2]]))
    engine.add(request("len", PROMPTS["d"], max_new_tokens=2))
    reasons: dict[str, tuple[FinishReason | None, int]] = {}
    counts = {"eos": 0, "len": 0}
    while engine.has_unfinished():
        for update in engine.step():
            counts[update.request_id] += len(update.new_token_ids)
            if update.is_finished:
                reasons[update.request_id] = (update.finish_reason, counts[update.request_id])
    assert reasons["eos"] == (FinishReason.STOP, greedy.index(greedy[2]) + 1)
    assert reasons["len"] == (FinishReason.LENGTH, 2)


def test_min_new_tokens_suppresses_eos(model: LlamaForCausalLM) -> None:
    greedy = run_to_end(batched_engine(model), [request("g", PROMPTS["d"])])["g"]
    eos = greedy[0]
    produced = run_to_end(batched_engine(model), [request("m", PROMPTS["d"], eos=[eos], min_new_tokens=5)])[
        "m"
    ]
    assert len(produced) >= 5
    assert eos not in produced[:4]


def test_beam_search_runs_on_its_own_path_among_batched_requests(model: LlamaForCausalLM) -> None:
    requests = [request("beam", PROMPTS["a"], max_new_tokens=6, num_beams=3), request("greedy", PROMPTS["b"])]
    produced = run_to_end(batched_engine(model), requests)
    assert len(produced["beam"]) == 6
    assert produced["greedy"] == run_to_end(batched_engine(model), [requests[1]])["greedy"]


def test_logit_bias_forces_and_bans_tokens_per_sequence(model: LlamaForCausalLM) -> None:
    plain = request("plain", PROMPTS["a"], max_new_tokens=6)
    forced = request("forced", PROMPTS["a"], max_new_tokens=6, logit_bias=((42, 100.0),))
    banned_token = run_to_end(batched_engine(model), [plain])["plain"][0]
    banned = request("banned", PROMPTS["a"], max_new_tokens=6, logit_bias=((banned_token, -100.0),))
    produced = run_to_end(batched_engine(model), [plain, forced, banned])
    assert produced["forced"] == [42] * 6
    assert banned_token not in produced["banned"]
    assert produced["plain"] == run_to_end(batched_engine(model), [plain])["plain"]


def test_rows_outgrowing_the_budget_are_preempted_and_resume_where_they_stopped(
    model: LlamaForCausalLM,
) -> None:
    # Three rows of 3 + 1 positions fit a budget of 16 (3 x 4); at 3 x 6 the newest must give way.
    requests = [
        request("a", [1, 2, 3], max_new_tokens=8),
        request("b", [4, 5, 6], max_new_tokens=8),
        request("c", [7, 8, 9], max_new_tokens=8, temperature=1.0, seed=5),
    ]
    unconstrained = run_to_end(batched_engine(model), requests)
    engine = batched_engine(model, max_batch_tokens=16)
    for r in requests:
        engine.add(r)
    running_at_once, produced = [], {r.request_id: [] for r in requests}
    while engine.has_unfinished():
        updates = engine.step()
        running_at_once.append(len(engine._rows))
        for update in updates:
            assert not update.failed
            produced[update.request_id] += update.new_token_ids
        held = engine.stats().kv_reserved_tokens
        assert held <= 16 or len(engine._rows) == 1  # a lone row may exceed the budget, never a batch
    assert max(running_at_once) == 3 and min(running_at_once[1:-1]) < 3  # all started; some were preempted
    # Greedy rows give the same tokens; the seeded row goes on with its own generator.
    assert produced == unconstrained


PER_SEQUENCE_SETTINGS: dict[str, dict[str, object]] = {
    "repetition": {"repetition_penalty": 1.8},
    "presence_frequency": {"presence_penalty": 1.5, "frequency_penalty": 1.0},
    "no_repeat_ngram": {"no_repeat_ngram_size": 2},
    "top_k": {"temperature": 0.8, "top_k": 5, "seed": 3},
    "top_p": {"temperature": 1.2, "top_p": 0.5, "seed": 4},
    "typical_p": {"temperature": 1.0, "typical_p": 0.6, "seed": 5},
    "min_p": {"temperature": 1.0, "min_p": 0.2, "seed": 6},
    "min_tokens": {"min_new_tokens": 10},
}


def test_every_sequence_keeps_its_own_parameters_inside_one_batch(model: LlamaForCausalLM) -> None:
    requests = [
        request(name, PROMPTS["b"], max_new_tokens=10, eos=[3], **settings)  # type: ignore[arg-type]
        for name, settings in PER_SEQUENCE_SETTINGS.items()
    ]
    alone = {r.request_id: run_to_end(batched_engine(model), [r])[r.request_id] for r in requests}
    together = run_to_end(batched_engine(model), [*requests, request("greedy", PROMPTS["a"])])
    assert {name: together[name] for name in alone} == alone
    # The parameters really act: the sampled sequences leave plain greedy's path on the same prompt.
    plain = run_to_end(batched_engine(model), [request("plain", PROMPTS["b"], max_new_tokens=10, eos=[3])])[
        "plain"
    ]
    assert all(together[name] != plain for name in ("top_k", "top_p", "typical_p", "min_p"))


# A long shared start, like a chat template's system prompt; the prompts below continue it.
SHARED = [40 + (i * 7) % 60 for i in range(30)]
Arrivals = dict[str | None, list[EngineRequest]]


def drive(engine: TransformersEngine, arrivals: Arrivals) -> list[list[SequenceUpdate]]:
    """Step to the end: ``arrivals[None]`` are added first, ``arrivals[rid]`` right after ``rid`` finishes."""
    for r in arrivals.get(None, []):
        engine.add(r)
    steps = []
    while engine.has_unfinished():
        steps.append(engine.step())
        for finished in [u.request_id for u in steps[-1] if u.is_finished]:
            for r in arrivals.get(finished, []):
                engine.add(r)
    return steps


def tokens_of(steps: list[list[SequenceUpdate]]) -> dict[str, list[int]]:
    produced: dict[str, list[int]] = {}
    for update in (u for step in steps for u in step):
        produced.setdefault(update.request_id, []).extend(update.new_token_ids)
    return produced


def with_and_without_prefix_cache(
    model: LlamaForCausalLM, arrivals: Arrivals, **limits: int
) -> tuple[list[list[SequenceUpdate]], list[list[SequenceUpdate]], int]:
    """The steps of the same arrivals with the prefix cache on, then off; and the tokens the cache served."""
    cached = batched_engine(model, prefix_cache_tokens=1000, **limits)
    with_cache = drive(cached, arrivals)
    without_cache = drive(batched_engine(model, **limits), arrivals)
    return with_cache, without_cache, cached.stats().prefix_cache_hit_tokens


def test_prompts_reusing_a_cached_prefix_in_one_prefill_step_decode_as_without_the_cache(
    model: LlamaForCausalLM,
) -> None:
    group = [
        request("longer_rest", [*SHARED, 2, 3, 4, 5]),
        request("one_token_rest", [*SHARED, 6]),
        request("unrelated", PROMPTS["b"]),
        request("shorter_share", [*SHARED[:20], *range(7, 20)]),
    ]
    arrivals: Arrivals = {None: [request("warm", [*SHARED, 1], max_new_tokens=2)], "warm": group}
    with_cache, without_cache, hit_tokens = with_and_without_prefix_cache(model, arrivals)
    assert tokens_of(with_cache) == tokens_of(without_cache)
    # The whole group was prefilled in one step: it all produced its first token then.
    assert {r.request_id for r in group} in [{u.request_id for u in step} for step in with_cache]
    # 30 tokens reused by each of the first two, 20 by the last one; none by the unrelated prompt.
    assert hit_tokens == 30 + 30 + 20


def test_a_burst_sharing_an_uncached_prefix_computes_it_once_and_decodes_as_without_the_cache(
    model: LlamaForCausalLM,
) -> None:
    burst = [request(f"r{index}", [*SHARED, 50 + index, 51 + index]) for index in range(4)]
    burst.append(request("unrelated", PROMPTS["b"]))
    with_cache, without_cache, hit_tokens = with_and_without_prefix_cache(model, {None: burst})
    assert tokens_of(with_cache) == tokens_of(without_cache)
    # Nothing was cached when they arrived: the shared 30 tokens ran once and all four reused them.
    assert hit_tokens == 4 * 30


def test_a_prompt_reusing_a_finished_requests_prefix_joins_running_decodes_unchanged(
    model: LlamaForCausalLM,
) -> None:
    arrivals: Arrivals = {
        None: [
            request("early", [*SHARED, 1], max_new_tokens=3),
            request("running", PROMPTS["b"], max_new_tokens=30),
        ],
        "early": [request("late", [*SHARED, 9, 8, 7], max_new_tokens=12)],
    }
    with_cache, without_cache, hit_tokens = with_and_without_prefix_cache(model, arrivals)
    assert tokens_of(with_cache) == tokens_of(without_cache)
    first = next(index for index, step in enumerate(with_cache) if any(u.request_id == "late" for u in step))
    assert {u.request_id for u in with_cache[first]} == {"late"}  # its prefill step
    assert {u.request_id for u in with_cache[first + 1]} == {"running", "late"}  # it joined the decodes
    assert hit_tokens == 30


def test_the_rest_of_a_prompt_after_a_cached_prefix_is_chunked_by_the_prefill_budget(
    model: LlamaForCausalLM,
) -> None:
    arrivals: Arrivals = {
        None: [request("warm", [*SHARED, 1], max_new_tokens=2)],
        "warm": [request("long_rest", [*SHARED, *range(20, 31)]), request("next", [*SHARED, 5, 5, 5, 5, 5])],
    }
    with_cache, without_cache, hit_tokens = with_and_without_prefix_cache(
        model, arrivals, max_prefill_tokens=4
    )
    assert tokens_of(with_cache) == tokens_of(without_cache)
    assert hit_tokens == 30 + 30
    # 11 tokens after the cached 30 at 4 a step: the first token comes 3 steps after arrival, not 11.
    arrival = next(
        i for i, step in enumerate(with_cache) if any(u.request_id == "warm" and u.is_finished for u in step)
    )
    first = next(i for i, step in enumerate(with_cache) if any(u.request_id == "long_rest" for u in step))
    assert first - arrival == 3


def test_prompt_logprobs_requests_bypass_the_prefix_cache_and_score_the_same(model: LlamaForCausalLM) -> None:
    scored = EngineRequest(
        "scored",
        (*SHARED, 3, 4),
        SamplingParams(),
        max_new_tokens=4,
        eos_token_ids=frozenset(),
        prompt_logprobs=2,
    )
    arrivals: Arrivals = {
        None: [request("warm", [*SHARED, 1], max_new_tokens=2)],
        "warm": [scored, request("plain", [*SHARED, 5, 6])],
    }
    with_cache, without_cache, hit_tokens = with_and_without_prefix_cache(model, arrivals)

    def prompt_scores(steps: list[list[SequenceUpdate]]) -> tuple[TokenScore | None, ...]:
        first = next(u for step in steps for u in step if u.request_id == "scored")
        assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(
            scored.prompt_token_ids
        )
        return first.prompt_logprobs

    # The same tokens, ranked the same, with the same log-probabilities up to rounding. With the cache
    # the scored prompt shares its padded forward with the plain prompt's last 2 tokens, whose 30
    # cached columns put 30 masked key columns before its own 32; without it, both prompts run 32
    # columns and no past. The attention's shapes differ, and so may its last bit (one ulp of one
    # top log-probability on a 2-core Xeon, none on the EPYC).
    scored_with, scored_without = prompt_scores(with_cache), prompt_scores(without_cache)
    assert _ids(scored_with) == _ids(scored_without)
    assert _logprobs(scored_with) == pytest.approx(_logprobs(scored_without), rel=1e-6, abs=1e-6)
    assert tokens_of(with_cache) == tokens_of(without_cache)
    assert hit_tokens == 30  # the plain prompt's reuse only


def _ids(scores: tuple[TokenScore | None, ...]) -> list[tuple[int, tuple[int, ...]] | None]:
    return [None if s is None else (s.token_id, tuple(t for t, _ in s.top)) for s in scores]


def _logprobs(scores: tuple[TokenScore | None, ...]) -> list[float]:
    return [p for s in scores if s is not None for p in (s.logprob, *(lp for _, lp in s.top))]
