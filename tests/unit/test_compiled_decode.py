"""The compiled decode step (``--compile``) gives the eager step's greedy tokens with two graphs: one
row, and one for every other batch size, traced at start-up and never again while serving."""

from __future__ import annotations

import pytest

from tests.engines import request, run_to_end, tiny_llama
from worker.engine.compiled_decode import graph_sizes
from worker.engine.graphed_decode import buckets_for
from worker.engine.hf import TransformersEngine
from worker.engine.scheduler import BatchLimits

# Tracing and compiling the tiny model takes seconds per graph; the machine may be busy.
pytestmark = pytest.mark.timeout(600)

PROMPTS = {"a": [5, 6, 7], "b": [9, 10, 11, 12, 13, 14, 15, 16, 17], "c": [20]}


def test_buckets_are_powers_of_two_up_to_the_batch_cap() -> None:
    assert buckets_for(1) == (1,)
    assert buckets_for(6) == (1, 2, 4, 6)
    assert buckets_for(32) == (1, 2, 4, 8, 16, 32)


def test_start_up_traces_one_row_and_one_dynamic_batch() -> None:
    assert graph_sizes(1) == (1,)
    assert graph_sizes(4) == (1, 4)
    assert graph_sizes(64) == (1, 6)


def test_compiled_and_eager_decode_give_the_same_greedy_tokens_without_tracing_again() -> None:
    # Five rows (the dynamic graph is traced on six at start-up), then fewer as they finish, down to one.
    prompts = {**PROMPTS, "d": [30, 31], "e": [40, 41, 42, 43]}
    lengths = (6, 12, 20, 9, 15)
    requests = [
        request(rid, prompt, max_new_tokens=n)
        for (rid, prompt), n in zip(prompts.items(), lengths, strict=True)
    ]
    eager = run_to_end(TransformersEngine(tiny_llama(), BatchLimits(max_batch_size=8)), requests)
    engine = TransformersEngine(tiny_llama(), BatchLimits(max_batch_size=8), compile_options={})
    engine.compile_decode()
    frames_before = _compiled_frames()
    assert frames_before >= 2  # the counter counts this engine's two graphs
    assert run_to_end(engine, requests) == eager
    assert engine._compiled is not None  # it never fell back to the eager step
    assert _compiled_frames() == frames_before  # no batch size, length or storage growth traced again


def test_a_decode_step_that_fails_to_compile_at_start_up_is_served_eagerly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from worker.engine.compiled_decode import CompiledDecode

    def fails(self: CompiledDecode) -> None:
        raise RuntimeError("Constraints violated")

    monkeypatch.setattr(CompiledDecode, "warm_up", fails)
    requests = [request(rid, prompt, max_new_tokens=5) for rid, prompt in PROMPTS.items()]
    eager = run_to_end(TransformersEngine(tiny_llama(), BatchLimits(max_batch_size=4)), requests)
    engine = TransformersEngine(tiny_llama(), BatchLimits(max_batch_size=4), compile_options={})
    engine.compile_decode()  # does not raise: the worker still starts
    assert engine._compiled is None
    assert "decoding eagerly" in caplog.text
    assert run_to_end(engine, requests) == eager


def _compiled_frames() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def test_column_buckets_are_powers_of_two_from_the_quantum() -> None:
    from worker.engine.graphed_decode import column_bucket

    assert [column_bucket(width) for width in (1, 256, 257, 600, 1025)] == [256, 256, 512, 1024, 2048]
