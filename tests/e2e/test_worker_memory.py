"""A loaded worker does not keep its checkpoint resident: once fusing and packing have read the
memory-mapped weights, the map's pages go, and the weights still read from it (the embedding, the
norms) come back a page at a time (``worker/model/freed_memory.py``). Served at another dtype than
the checkpoint's, the embedding's rows are read from the file too (``worker/model/file_embedding.py``)."""

from __future__ import annotations

from pathlib import Path

from shared.settings import WorkerSettings
from worker.engine import EngineRequest, SamplingParams
from worker.engine.hf import TransformersEngine
from worker.model.backend import Backend, load_backend
from worker.model.file_embedding import CheckpointEmbedding
from worker.model.onednn_linear import PackedLinear

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
    assert _generated(backend) == 4  # the weights read back from the file serve
    assert _checkpoint_resident_kb() < 32 * MB


def test_a_bf16_worker_reads_its_embedding_rows_from_the_fp32_checkpoint_and_serves() -> None:
    backend = load_backend(WorkerSettings(dtype="bfloat16"))
    assert isinstance(backend.engine, TransformersEngine)
    model = backend.engine._model
    if isinstance(model.lm_head, PackedLinear):  # the LM head has a copy of its own (oneDNN runs bf16)
        embedding = model.get_input_embeddings()
        assert isinstance(embedding, CheckpointEmbedding)  # the 57 MB bf16 copy is gone
    else:  # still tied: the embedding is the LM head's weight, which must stay
        assert type(model.get_input_embeddings()).__name__ == "Embedding"
    assert _checkpoint_resident_kb() < 32 * MB
    assert _generated(backend) == 4
    assert _checkpoint_resident_kb() < 32 * MB


def _generated(backend: Backend) -> int:
    engine = backend.engine
    engine.add(EngineRequest("r", (1, 2, 3, 4), SamplingParams(), 4, frozenset()))
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(update.new_token_ids) for update in engine.step())
    return tokens
