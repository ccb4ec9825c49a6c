"""Owns reading the input embedding's rows from the checkpoint file when loading converted them.

Loading a checkpoint at another dtype than the one served (SmolLM2's fp32 safetensors served in
bf16) copies every weight into the process's own memory. Packing then replaces the Linears' copies
(``onednn_linear.py``), the LM head's too, tied or not; the embedding's stays: 57 MB of SmolLM2's
memory in bf16, of which a generation reads one row per token. Where nothing else reads that copy,
``read_embedding_from_checkpoint`` frees it: lookups read the rows from the checkpoint file, mapped
into memory, and cast them to the served dtype (a row per token: microseconds). The map's pages
then leave memory with the rest of the checkpoint's (``freed_memory.release_mapped_weights``) and
come back from the page cache a page at a time, as tokens use their rows.

The file is trusted only as far as it is checked: its tensor must cast to exactly the weight that
loading made, else (renamed, transformed or quantized weights, another file layout) the model keeps
its copy. Only exact ``nn.Embedding`` modules on CPU are swapped. As with the checkpoint's own
map, the file must not be rewritten in place while the worker runs.
"""

from __future__ import annotations

import json
import logging
import mmap
import struct
import warnings
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

# safetensors' dtype names, for the ones a checkpoint's embedding is stored in.
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


class CheckpointEmbedding(nn.Module):
    """An embedding lookup on rows read from the checkpoint's file, cast to the served dtype."""

    rows: torch.Tensor

    def __init__(self, rows: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        # A buffer, not a parameter: the model's dtype (its first parameter's) stays the served one.
        self.register_buffer("rows", rows, persistent=False)
        self.num_embeddings, self.embedding_dim = rows.shape
        self.served_dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(input_ids, self.rows).to(self.served_dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, from {self.rows.dtype} to {self.served_dtype}"


def read_embedding_from_checkpoint(model: nn.Module, checkpoint: Path | None) -> bool:
    """Swap ``model``'s input embedding for a ``CheckpointEmbedding`` on ``checkpoint``'s file, where
    loading converted it, nothing else shares it and the file holds exactly it; whether it did.

    ``checkpoint``: the directory the model loaded from (None: not known, nothing done).
    """
    if checkpoint is None:
        return False
    try:
        embedding = model.get_input_embeddings()  # type: ignore[operator]
    except (NotImplementedError, AttributeError):  # a remote-code model that does not say
        return False
    if type(embedding) is not nn.Embedding or embedding.max_norm is not None:
        return False
    weight = embedding.weight
    if weight.device.type != "cpu" or _shared(model, weight):
        return False
    name = next((key for key, value in model.named_parameters() if value is weight), None)
    try:
        rows = None if name is None else _mapped_tensor(checkpoint, name)
    except (OSError, ValueError, KeyError, struct.error):  # unreadable: the model keeps its copy
        logger.info("cannot map the checkpoint's %s: the embedding stays in memory", name, exc_info=True)
        return False
    if rows is None or rows.dtype == weight.dtype or rows.shape != weight.shape:
        return False  # not found, or loading kept the file's dtype (its rows are already the map's)
    if not _same_after_cast(rows, weight):
        logger.info("the checkpoint's %s differs from the loaded embedding: kept in memory", name)
        return False
    model.set_input_embeddings(CheckpointEmbedding(rows, weight.dtype))  # type: ignore[operator]
    logger.info(
        "embedding rows read from the checkpoint as %s (%d MB of %s freed)",
        rows.dtype,
        weight.numel() * weight.element_size() >> 20,
        weight.dtype,
    )
    return True


def _same_after_cast(rows: torch.Tensor, weight: torch.Tensor, block: int = 4096) -> bool:
    """Whether ``rows`` cast to ``weight``'s dtype is ``weight``, compared a block of rows at a time
    (a whole cast copy would raise the start-up's peak by the weight's size)."""
    with torch.no_grad():
        return all(
            torch.equal(rows[start : start + block].to(weight.dtype), weight[start : start + block])
            for start in range(0, rows.shape[0], block)
        )


def _shared(model: nn.Module, weight: torch.Tensor) -> bool:
    """Whether anything but the embedding reads ``weight``'s memory: a tied LM head not packed (the
    same parameter in two modules), or another tensor viewing its storage."""
    storage = weight.untyped_storage().data_ptr()
    readers = [
        tensor
        for tensors in (
            model.named_parameters(remove_duplicate=False),
            model.named_buffers(remove_duplicate=False),
        )
        for _, tensor in tensors
        if not tensor.is_mkldnn and tensor.untyped_storage().data_ptr() == storage
    ]
    return len(readers) > 1


def _mapped_tensor(checkpoint: Path, name: str) -> torch.Tensor | None:
    """Tensor ``name`` of a safetensors checkpoint directory, as a view of its file mapped into memory."""
    file = _file_holding(checkpoint, name)
    if file is None:
        return None
    with file.open("rb") as handle:
        (header_size,) = struct.unpack("<Q", handle.read(8))
        entry = json.loads(handle.read(header_size)).get(name)
        dtype = None if entry is None else _DTYPES.get(entry.get("dtype"))
        if dtype is None:
            return None
        begin, end = (8 + header_size + offset for offset in entry["data_offsets"])
        aligned = begin - begin % mmap.ALLOCATIONGRANULARITY
        # Private and never written: its pages stay the file's, dropped and read back as the page
        # cache's. (Read-only would do the same, but torch warns on every view of an unwritable buffer.)
        mapped = mmap.mmap(handle.fileno(), end - aligned, offset=aligned, access=mmap.ACCESS_COPY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frombuffer's note that the tensor shares the buffer's memory
        flat = torch.frombuffer(
            mapped, dtype=dtype, offset=begin - aligned, count=(end - begin) // dtype.itemsize
        )
    return flat.view(entry["shape"])


def _file_holding(checkpoint: Path, name: str) -> Path | None:
    """The safetensors file of ``checkpoint`` holding tensor ``name`` (one file, or a sharded index)."""
    index = checkpoint / _INDEX
    if index.is_file():
        shard = json.loads(index.read_text()).get("weight_map", {}).get(name)
        return None if shard is None else checkpoint / shard
    single = checkpoint / _SINGLE
    return single if single.is_file() else None
