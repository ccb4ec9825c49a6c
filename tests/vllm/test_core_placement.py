"""Where ``--engine vllm`` runs vLLM's engine core: in the worker on CPU at every dtype, as the option
says when it is set, and as the environment says when it is not; and how many prompt tokens a core
step takes on CPU."""

from __future__ import annotations

import os

import pytest

from shared.settings import WorkerSettings
from worker.engine.vllm_adapter import launch
from worker.engine.vllm_adapter.launch import CORE_PLACEMENT as VARIABLE


def _placed(monkeypatch: pytest.MonkeyPatch, **settings: object) -> str:
    monkeypatch.delenv(VARIABLE, raising=False)
    launch._place_engine_core(WorkerSettings(engine="vllm", **settings))
    value = os.environ[VARIABLE]
    monkeypatch.delenv(VARIABLE)
    return value


def test_on_cpu_the_core_runs_in_the_worker_at_every_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    for dtype in ("bfloat16", "float16", "float32", "auto"):
        assert _placed(monkeypatch, dtype=dtype) == "0"


def test_the_option_decides_when_set_and_the_environment_when_not(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _placed(monkeypatch, dtype="bfloat16", vllm_multiprocessing=True) == "1"
    assert _placed(monkeypatch, dtype="float32", vllm_multiprocessing=False) == "0"
    monkeypatch.setenv(VARIABLE, "1")
    launch._place_engine_core(WorkerSettings(engine="vllm", dtype="bfloat16"))
    assert os.environ[VARIABLE] == "1"


def test_a_core_step_takes_512_prompt_tokens_on_cpu_unless_the_option_says() -> None:
    def batched(**settings: object) -> int:
        options = launch.engine_options(WorkerSettings(engine="vllm", **settings), "/a/model", True)
        return int(options["max_num_batched_tokens"])

    assert batched() == launch.CPU_BATCHED_TOKENS == 512
    assert batched(max_prefill_tokens=2048) == 2048
