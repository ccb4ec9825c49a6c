"""A model reads its embedding rows from the checkpoint file, not from a copy in memory or through a
map of the file, wherever the embedding is the lookup's alone and the file holds exactly it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from tests.unit.test_freed_memory import _map_of
from worker.model.file_embedding import CheckpointEmbedding, read_embedding_from_checkpoint
from worker.model.freed_memory import release_mapped_weights

VOCAB, HIDDEN = 4096, 256  # a 4 MB fp32 embedding: enough pages to see them leave


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved as fp32 safetensors, its LM head tied to the embedding (as SmolLM2's is)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    directory = tmp_path_factory.mktemp("tied-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def _loaded(checkpoint: Path, dtype: torch.dtype, untie: bool = True) -> Any:
    model: Any = LlamaForCausalLM.from_pretrained(checkpoint, dtype=dtype)
    model.eval()
    if untie:  # what packing does: the LM head gets a copy of its own
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone(), requires_grad=False)
    return model


def _logits(model: Any) -> torch.Tensor:
    with torch.inference_mode():
        logits: torch.Tensor = model(torch.tensor([[1, 7, 4095, 300, 2]])).logits
    return logits


def test_a_converted_embedding_reads_its_rows_from_the_checkpoint_and_answers_the_same(
    checkpoint: Path,
) -> None:
    model = _loaded(checkpoint, torch.bfloat16)
    before = _logits(model)

    assert read_embedding_from_checkpoint(model, checkpoint)

    embedding = model.get_input_embeddings()
    assert isinstance(embedding, CheckpointEmbedding)
    assert embedding.rows.dtype == torch.float32 and embedding.rows.shape == (VOCAB, HIDDEN)
    assert model.dtype == torch.bfloat16  # the rows are a buffer: the model's dtype is still the served one
    assert torch.equal(_logits(model), before)
    rows_map = _map_of(embedding.rows.data_ptr())
    assert rows_map is not None  # a view of the file, not memory of its own
    # The check read every row; once released, the pages are the page cache's again.
    release_mapped_weights(model)
    released_map = _map_of(embedding.rows.data_ptr())
    assert released_map is not None and released_map.resident_kb == 0
    assert torch.equal(_logits(model), before)  # read back from the file
    after_lookups = _map_of(embedding.rows.data_ptr())
    assert after_lookups is not None and after_lookups.resident_kb == 0  # read, not mapped in


def test_a_sharded_checkpoint_is_read_through_its_index(checkpoint: Path, tmp_path: Path) -> None:
    model = _loaded(checkpoint, torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="1MB")  # the 4 MB embedding in a shard of its own
    assert (tmp_path / "model.safetensors.index.json").is_file()
    served = _loaded(tmp_path, torch.bfloat16)
    before = _logits(served)
    assert read_embedding_from_checkpoint(served, tmp_path)
    assert torch.equal(_logits(served), before)


def test_an_embedding_the_lm_head_still_shares_is_kept(checkpoint: Path) -> None:
    model = _loaded(checkpoint, torch.bfloat16, untie=False)
    assert not read_embedding_from_checkpoint(model, checkpoint)
    assert type(model.get_input_embeddings()) is nn.Embedding


def test_an_embedding_loaded_at_the_files_dtype_reads_its_rows_from_the_file_too(checkpoint: Path) -> None:
    model = _loaded(checkpoint, torch.float32)
    before = _logits(model)
    assert read_embedding_from_checkpoint(model, checkpoint)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, CheckpointEmbedding) and embedding.served_dtype == torch.float32
    release_mapped_weights(model)
    assert torch.equal(_logits(model), before)
    rows_map = _map_of(embedding.rows.data_ptr())
    assert rows_map is not None and rows_map.resident_kb == 0


def test_repeated_tokens_read_their_row_once_and_a_token_past_the_vocabulary_is_refused(
    checkpoint: Path,
) -> None:
    model = _loaded(checkpoint, torch.bfloat16)
    expected = model.get_input_embeddings()(torch.tensor([[5, 9, 5], [9, 9, 0]]))
    assert read_embedding_from_checkpoint(model, checkpoint)
    embedding = model.get_input_embeddings()
    assert torch.equal(embedding(torch.tensor([[5, 9, 5], [9, 9, 0]])), expected)
    assert embedding(torch.empty((1, 0), dtype=torch.long)).shape == (1, 0, HIDDEN)
    with pytest.raises(IndexError):
        embedding(torch.tensor([[1, VOCAB]]))


def test_an_embedding_changed_after_loading_is_kept(checkpoint: Path) -> None:
    model = _loaded(checkpoint, torch.bfloat16)
    with torch.no_grad():
        model.get_input_embeddings().weight[3, 0] += 1.0
    assert not read_embedding_from_checkpoint(model, checkpoint)
    assert type(model.get_input_embeddings()) is nn.Embedding


def test_no_checkpoint_file_changes_nothing(checkpoint: Path, tmp_path: Path) -> None:
    model = _loaded(checkpoint, torch.bfloat16)
    assert not read_embedding_from_checkpoint(model, None)
    assert not read_embedding_from_checkpoint(model, tmp_path)  # no safetensors there
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    assert not read_embedding_from_checkpoint(model, tmp_path)  # unreadable: kept, no error
    assert type(model.get_input_embeddings()) is nn.Embedding
