"""Owns giving memory the worker no longer needs after start-up back to the system.

Two kinds, both measured serving SmolLM2-135M in fp32 on a 2-core Xeon (``VmRSS``):

- The checkpoint's memory map. transformers loads safetensors weights as views of the file
  mapped into memory, read as they are touched. Fusing and packing the Linear layers
  (``fused_projections.py``, ``onednn_linear.py``) copy and so read every weight, after which
  the whole map stayed resident (513 MB of file pages) because the embedding and the norms
  still pointed into it. ``own_mapped_weights`` copies what still does into the worker's own
  memory, the map is unmapped with its last view, and the loaded worker held 1,012 MB instead
  of 1,416.
- Freed heap. Loading converts tensors and packing copies every weight and frees the original;
  glibc keeps such freed blocks in its heap for reuse rather than return them (about 300 MB
  here). ``return_freed_memory`` (``malloc_trim``) returns them, once the model is ready and
  again after the warm-up (building the grammar compiler's vocabulary tables and the first
  forward left another ~30 MB freed in bf16).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays unimported in fake-engine workers, which trim too
    from torch import nn

logger = logging.getLogger(__name__)


def own_mapped_weights(model: nn.Module, maps: Path = Path("/proc/self/maps")) -> int:
    """Copy the CPU parameters and buffers that are views of a mapped file into memory of their
    own; returns how many bytes were copied. A no-op where the process's maps cannot be read."""
    import torch

    ranges = _file_mapped_ranges(maps)
    if not ranges:
        return 0
    copied = 0
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type != "cpu" or tensor.is_mkldnn or not _within(tensor.data_ptr(), ranges):
                continue
            # ``.data`` swapped in place: a tied weight (one Parameter in two modules) stays tied.
            tensor.data = tensor.data.clone()
            copied += tensor.numel() * tensor.element_size()
    if copied:
        logger.info("copied %d MB of weights out of the checkpoint's memory map", copied // 2**20)
    return copied


def return_freed_memory() -> None:
    """Ask the C allocator to return free heap memory; a no-op where it is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return  # not glibc (musl, macOS): nothing to trim
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def _file_mapped_ranges(maps: Path) -> list[tuple[int, int]]:
    """The address ranges of this process mapped from files (a path after the inode), per ``maps``."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:  # not Linux
        return []
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        # address perms offset dev inode [path]; anonymous maps have inode 0 and no file path.
        if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def _within(address: int, ranges: list[tuple[int, int]]) -> bool:
    return any(start <= address < end for start, end in ranges)
