"""Owns reading the input embedding's rows from the checkpoint file instead of from memory.

A generation reads one embedding row per token, yet the embedding is the largest weight of a small
model: SmolLM2's is 108 MB in fp32. Loaded at another dtype than the checkpoint's (its fp32 file
served in bf16), every weight is copied into the process's own memory, and packing then replaces
the Linears' copies (``onednn_linear.py``), the LM head's too, tied or not; the embedding's stays
(57 MB in bf16). Loaded at the file's dtype, the embedding is a view of the checkpoint mapped into
memory, and each row read through the map faults in as much of the file as the kernel maps per
fault: a page and its fault-around window here, a whole page-cache folio (up to 2 MB) where the
file system caches large folios (CI's machine kept 33 MB of the map after a four-token generation).

Where nothing else reads the embedding, ``read_embedding_from_checkpoint`` swaps it for a
``CheckpointEmbedding``, whose lookups read the rows of the tokens in use from the file with
``preadv`` (one call per distinct row: microseconds) and cast them to the served dtype. The
rows come through the page cache, shared by the workers on a machine, and nothing of the file
stays mapped into the worker. Under ``torch.compile`` the lookup reads the same rows through a map
of the file instead, which the compiler can trace.

The file is trusted only as far as it is checked: its tensor must cast to exactly the weight that
loading made, else (renamed, transformed or quantized weights, another file layout) the model keeps
its copy. Only exact ``nn.Embedding`` modules on CPU are swapped. As with the checkpoint's own
map, the file must not be rewritten in place while the worker runs (a download or conversion
renames a new file into place, which leaves the open one alone).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import warnings
import weakref
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

# safetensors' dtype names, for the ones a checkpoint's embedding is stored in.
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


class FileRows:
    """The rows of a 2-D tensor stored in a file, read a row at a time with ``preadv``."""

    def __init__(self, path: Path, offset: int, dtype: torch.dtype, shape: tuple[int, int]) -> None:
        self.offset, self.dtype, self.shape = offset, dtype, shape
        self.row_bytes = shape[1] * dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        weakref.finalize(self, os.close, self._fd)

    def read(self, tokens: list[int]) -> torch.Tensor:
        """Rows ``tokens`` (distinct), ``[len(tokens), dim]`` in the file's dtype."""
        rows = torch.empty((len(tokens), self.shape[1]), dtype=self.dtype)
        buffers = rows.view(torch.uint8).numpy()  # bf16 has no numpy dtype; its bytes do
        for position, token in enumerate(tokens):
            if not 0 <= token < self.shape[0]:
                raise IndexError(f"token id {token} is outside the embedding's {self.shape[0]} rows")
            read = os.preadv(self._fd, [buffers[position]], self.offset + token * self.row_bytes)
            if read != self.row_bytes:
                raise OSError(f"the checkpoint file ended inside the embedding's row {token}")
        return rows


class CheckpointEmbedding(nn.Module):
    """An embedding lookup on rows read from the checkpoint's file, cast to the served dtype."""

    rows: torch.Tensor

    def __init__(self, file: FileRows, rows: torch.Tensor, dtype: torch.dtype) -> None:
        """``rows``: the same tensor as a view of the file mapped into memory, for ``torch.compile``."""
        super().__init__()
        self.file = file
        # A buffer, not a parameter: the model's dtype (its first parameter's) stays the served one.
        self.register_buffer("rows", rows, persistent=False)
        self.num_embeddings, self.embedding_dim = rows.shape
        self.served_dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # a traceable lookup; it reads the rows through the map
            return nn.functional.embedding(input_ids, self.rows).to(self.served_dtype)
        tokens = input_ids.reshape(-1).tolist()
        distinct = dict.fromkeys(tokens)  # a prompt repeats tokens: each row is read once
        rows = self.file.read(list(distinct))
        if len(distinct) < len(tokens):
            positions = {token: position for position, token in enumerate(distinct)}
            rows = rows[torch.tensor([positions[token] for token in tokens])]
        return rows.view(*input_ids.shape, self.embedding_dim).to(self.served_dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, from {self.rows.dtype} to {self.served_dtype}"


def read_embedding_from_checkpoint(model: nn.Module, checkpoint: Path | None) -> bool:
    """Swap ``model``'s input embedding for a ``CheckpointEmbedding`` on ``checkpoint``'s file, where
    nothing else reads it and the file holds exactly it (at the served dtype or another); whether it did.

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
        found = None if name is None else _file_rows(checkpoint, name)
    except (OSError, ValueError, KeyError, struct.error):  # unreadable: the model keeps its copy
        logger.info("cannot read the checkpoint's %s: the embedding stays in memory", name, exc_info=True)
        return False
    if found is None or found[0].shape != tuple(weight.shape):
        return False  # not found, or another shape
    file, rows = found
    if not _same_after_cast(rows, weight):
        logger.info("the checkpoint's %s differs from the loaded embedding: kept in memory", name)
        return False
    model.set_input_embeddings(CheckpointEmbedding(file, rows, weight.dtype))  # type: ignore[operator]
    logger.info(
        "embedding rows read from the checkpoint file as %s (%d MB of %s no longer read from memory)",
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


def _file_rows(checkpoint: Path, name: str) -> tuple[FileRows, torch.Tensor] | None:
    """Where 2-D tensor ``name`` of a safetensors checkpoint directory lies in its file, and the
    tensor as a view of the file mapped into memory (its pages read only when touched)."""
    file = _file_holding(checkpoint, name)
    if file is None:
        return None
    with file.open("rb") as handle:
        (header_size,) = struct.unpack("<Q", handle.read(8))
        entry = json.loads(handle.read(header_size)).get(name)
        dtype = None if entry is None else _DTYPES.get(entry.get("dtype"))
        if dtype is None or len(entry["shape"]) != 2:
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
    rows, dim = entry["shape"]
    return FileRows(file, begin, dtype, (rows, dim)), flat.view(rows, dim)


def _file_holding(checkpoint: Path, name: str) -> Path | None:
    """The safetensors file of ``checkpoint`` holding tensor ``name`` (one file, or a sharded index)."""
    index = checkpoint / _INDEX
    if index.is_file():
        shard = json.loads(index.read_text()).get("weight_map", {}).get(name)
        return None if shard is None else checkpoint / shard
    single = checkpoint / _SINGLE
    return single if single.is_file() else None
