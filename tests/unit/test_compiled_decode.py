"""The compiled decode step (``--compile``) gives the eager step's greedy tokens, per batch-size bucket."""

from __future__ import annotations

import pytest

from tests.engines import request, run_to_end, tiny_llama
from worker.engine.compiled_decode import buckets_for
from worker.engine.hf import TransformersEngine
from worker.engine.scheduler import BatchLimits

# Tracing and compiling the tiny model takes seconds per bucket; the machine may be busy.
pytestmark = pytest.mark.timeout(600)

PROMPTS = {"a": [5, 6, 7], "b": [9, 10, 11, 12, 13, 14, 15, 16, 17], "c": [20]}


def test_buckets_are_powers_of_two_up_to_the_batch_cap() -> None:
    assert buckets_for(1) == (1,)
    assert buckets_for(6) == (1, 2, 4, 6)
    assert buckets_for(32) == (1, 2, 4, 8, 16, 32)


def test_compiled_and_eager_decode_give_the_same_greedy_tokens() -> None:
    # Three rows run in the 4-row bucket (one idle row), then fewer as they finish (1- and 2-row ones).
    lengths = (6, 12, 20)
    requests = [
        request(rid, prompt, max_new_tokens=n)
        for (rid, prompt), n in zip(PROMPTS.items(), lengths, strict=True)
    ]
    eager = run_to_end(TransformersEngine(tiny_llama(), BatchLimits(max_batch_size=4)), requests)
    engine = TransformersEngine(tiny_llama(), BatchLimits(max_batch_size=4), compile_options={})
    engine.compile_decode()
    assert run_to_end(engine, requests) == eager
    assert engine._compiled is not None  # it never fell back to the eager step


def test_column_buckets_are_powers_of_two_from_the_quantum() -> None:
    from worker.engine.graphed_decode import column_bucket

    assert [column_bucket(width) for width in (1, 256, 257, 600, 1025)] == [256, 256, 512, 1024, 2048]
