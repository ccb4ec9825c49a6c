"""A loaded worker holds its weights in memory of its own: the checkpoint's memory map is gone once
fusing and packing have read it (``worker/model/freed_memory.py``)."""

from __future__ import annotations

from pathlib import Path

from shared.settings import WorkerSettings
from worker.engine import EngineRequest, SamplingParams
from worker.model.backend import load_backend


def test_a_loaded_fp32_model_reads_nothing_from_its_checkpoints_memory_map() -> None:
    backend = load_backend(WorkerSettings(dtype="float32"))
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if ".safetensors" in line]
    assert mapped == []  # the bundled model's map held 513 MB resident before it was released
    engine = backend.engine
    engine.add(EngineRequest("r", (1, 2, 3, 4), SamplingParams(), 4, frozenset()))
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(update.new_token_ids) for update in engine.step())
    assert tokens == 4  # the weights copied out of the map still serve
