"""The Engine contract, checked against every backend: the fake, the batched transformers engine and,
under ``make test-vllm``, vLLM's (``worker/engine/vllm_adapter``) on the bundled model."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from shared.protocol import FinishReason
from tests.conftest import VLLM_TESTS
from tests.engines import batched_engine, request, run_to_end, run_with_failures, tiny_llama
from worker.engine import Engine, EngineStats
from worker.engine.fake import FakeEngine

EngineFactory = Callable[[], Engine]


@pytest.fixture(scope="module", params=["fake", "transformers", *(["vllm"] if VLLM_TESTS else [])])
def make_engine(request: pytest.FixtureRequest) -> Iterator[EngineFactory]:
    if request.param == "fake":
        yield lambda: FakeEngine("contract text ☕ ", max_batch_size=8)
    elif request.param == "transformers":
        model = tiny_llama()
        yield lambda: batched_engine(model, max_batch_size=8)
    else:
        from tests.vllm_engine import shared_vllm_engine

        with shared_vllm_engine() as make:
            yield make


def test_max_new_tokens_gives_exactly_that_many_and_length(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add(request("r", [1, 2, 3], max_new_tokens=7))
    updates = []
    while engine.has_unfinished():
        updates += engine.step()
    assert sum(len(u.new_token_ids) for u in updates) == 7
    assert [u.finish_reason for u in updates if u.is_finished] == [FinishReason.LENGTH]
    assert updates[-1].is_finished


def test_greedy_is_deterministic_across_engines(make_engine: EngineFactory) -> None:
    requests = [request("a", [4, 5]), request("b", [6, 7, 8])]
    assert run_to_end(make_engine(), requests) == run_to_end(make_engine(), requests)


def test_no_updates_after_finish_or_abort(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add(request("short", [1], max_new_tokens=1))
    engine.add(request("gone", [2], max_new_tokens=50))
    engine.add(request("waits", [3], max_new_tokens=50))
    engine.abort("waits")
    engine.abort("never-added")
    seen: list[str] = []
    for _ in range(3):
        seen += [u.request_id for u in engine.step()]
        engine.abort("gone")
    assert seen.count("short") == 1
    assert "waits" not in seen
    assert seen.count("gone") <= 1
    assert not engine.has_unfinished()


def test_stats_count_waiting_then_running_then_nothing(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add(request("r", [1, 2], max_new_tokens=3))
    assert (engine.stats().running, engine.stats().waiting) == (0, 1)
    engine.step()
    assert (engine.stats().running, engine.stats().waiting) == (1, 0)
    while engine.has_unfinished():
        engine.step()
    idle = engine.stats()
    assert idle == EngineStats(running=0, waiting=0, kv_capacity_tokens=idle.kv_capacity_tokens)


def test_close_forgets_everything(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add(request("r", [1, 2], max_new_tokens=5))
    engine.step()
    engine.close()
    assert not engine.has_unfinished()


def test_a_sequence_the_model_cannot_run_fails_alone(make_engine: EngineFactory) -> None:
    good = [request("a", [4, 5], max_new_tokens=6), request("b", [6, 7, 8], max_new_tokens=6)]
    bad = request("bad", [4, 100_000, 5], max_new_tokens=6)  # no engine's vocabulary has that id
    without = run_to_end(make_engine(), good)
    produced, failed = run_with_failures(make_engine(), [good[0], bad, good[1]])
    assert failed == {"bad"}
    assert produced["bad"] == []
    assert {rid: produced[rid] for rid in without} == without
