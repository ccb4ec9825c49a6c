"""A loaded worker does not keep its checkpoint resident: once fusing and packing have read the
memory-mapped weights, the map's pages go, and the weights still read from it (the embedding, the
norms) come back a page at a time (``worker/model/freed_memory.py``)."""

from __future__ import annotations

from pathlib import Path

from shared.settings import WorkerSettings
from worker.engine import EngineRequest, SamplingParams
from worker.model.backend import load_backend

MB = 1024


def _checkpoint_resident_kb() -> int:
    resident, in_checkpoint = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and all(char in "0123456789abcdef-" for char in fields[0]):
            in_checkpoint = line.rstrip().endswith(".safetensors")
        elif in_checkpoint and fields[0] == "Rss:":
            resident += int(fields[1])
    return resident


def test_a_loaded_fp32_model_keeps_little_of_its_checkpoint_resident_and_still_serves() -> None:
    backend = load_backend(WorkerSettings(dtype="float32"))
    assert _checkpoint_resident_kb() < 32 * MB  # the bundled model's whole 513 MB map was, before
    engine = backend.engine
    engine.add(EngineRequest("r", (1, 2, 3, 4), SamplingParams(), 4, frozenset()))
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(update.new_token_ids) for update in engine.step())
    assert tokens == 4  # the weights read back from the file serve
    assert _checkpoint_resident_kb() < 32 * MB
