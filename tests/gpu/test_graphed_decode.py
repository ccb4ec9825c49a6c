"""CUDA graphs of the decode step give the eager step's greedy tokens (``make test-gpu``: a GPU only).

Run where a GPU is: ``TOKENFERRY_TEST_GPU=1 pytest tests/gpu`` (``make test-gpu``); ``make test``
leaves this folder out, as it leaves tests/vllm out.
"""

from __future__ import annotations

import pytest
import torch

from tests.engines import request, run_to_end, tiny_llama
from worker.engine.graphed_decode import GraphedDecode
from worker.engine.hf import TransformersEngine
from worker.engine.scheduler import BatchLimits

pytestmark = pytest.mark.timeout(600)

PROMPTS = {"a": [5, 6, 7], "b": [9, 10, 11, 12, 13, 14, 15, 16, 17], "c": [20]}


def _engines(max_rows: int = 4) -> tuple[TransformersEngine, TransformersEngine]:
    eager = TransformersEngine(tiny_llama().cuda(), BatchLimits(max_batch_size=max_rows), cuda_graphs=False)
    graphed = TransformersEngine(tiny_llama().cuda(), BatchLimits(max_batch_size=max_rows))
    graphed.compile_decode()
    return eager, graphed


def test_graphed_and_eager_decode_give_the_same_greedy_tokens() -> None:
    # Three rows run in the 4-row bucket (one idle row), then fewer as they finish (1- and 2-row graphs).
    requests = [
        request(rid, prompt, max_new_tokens=n)
        for (rid, prompt), n in zip(PROMPTS.items(), (6, 12, 20), strict=True)
    ]
    eager, graphed = _engines()
    assert run_to_end(graphed, requests) == run_to_end(eager, requests)
    assert isinstance(graphed._compiled, GraphedDecode)  # it never fell back to the eager step


def test_graphs_are_captured_again_when_the_storage_grows() -> None:
    # 300 prompt tokens outgrow the storage captured at start-up (256 columns): it is reallocated.
    long_prompt = [(7 * index) % 120 + 1 for index in range(300)]
    requests = [request("long", long_prompt, max_new_tokens=8), request("short", [3, 4], max_new_tokens=8)]
    eager, graphed = _engines()
    assert isinstance(graphed._compiled, GraphedDecode)
    at_start = graphed._compiled.captures
    assert run_to_end(graphed, requests) == run_to_end(eager, requests)
    assert graphed._compiled.captures > at_start


def test_an_idle_engine_keeps_its_storage_and_its_graphs() -> None:
    requests = [request(rid, prompt, max_new_tokens=6) for rid, prompt in PROMPTS.items()]
    eager, graphed = _engines()
    assert isinstance(graphed._compiled, GraphedDecode)
    first = run_to_end(graphed, requests)
    captured = graphed._compiled.captures
    assert run_to_end(graphed, requests) == first == run_to_end(eager, requests)
    assert graphed._compiled.captures == captured  # the second batch replayed the same graphs


def test_bf16_rows_decode_under_graphs() -> None:
    model = tiny_llama().cuda().to(torch.bfloat16)
    engine = TransformersEngine(model, BatchLimits(max_batch_size=8))
    engine.compile_decode()
    tokens = run_to_end(engine, [request(str(i), [i + 1, i + 2], max_new_tokens=10) for i in range(5)])
    assert all(len(produced) == 10 for produced in tokens.values())
    assert isinstance(engine._compiled, GraphedDecode)
