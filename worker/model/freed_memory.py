"""Owns giving memory the worker no longer needs after start-up back to the system.

Two kinds, both measured serving SmolLM2-135M in fp32 on a 2-core Xeon (``VmRSS``):

- The checkpoint's memory map. transformers loads safetensors weights as views of the file
  mapped into memory, read as they are touched. Fusing and packing the Linear layers
  (``fused_projections.py``, ``onednn_linear.py``) copy and so read every weight, after which
  the whole map stayed resident (513 MB of file pages) because the embedding and the norms
  still pointed into it. ``release_mapped_weights`` drops its pages (the weights still read
  from it come back a page at a time, as used): the loaded worker held 903 MB instead of
  1,416 (1,012 when the embedding was copied out instead). Where it can, the embedding now reads
  its rows from the file without a map (``file_embedding.py``), and the map is read by nothing.
- Freed heap. Loading converts tensors and packing copies every weight and frees the original;
  glibc keeps such freed blocks in its heap for reuse rather than return them (about 300 MB
  here). ``return_freed_memory`` (``malloc_trim``) returns them, once the model is ready,
  again after the warm-up (building the grammar compiler's vocabulary tables and the first
  forward left another ~30 MB freed in bf16), and after each idle spell
  (``EngineDriver._wait_for_work``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays unimported in fake-engine workers, which trim too
    import torch
    from torch import nn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Released:
    """What ``release_mapped_weights`` did: bytes of weights left to the file, bytes copied out."""

    left_to_file: int = 0
    copied: int = 0


# Below this a weight still read from the map is copied out before the map's pages go: read through
# the map, a norm's few kB cost a whole fault-around window or page-cache folio each. SmolLM2's map
# held 6.5 MB after a four-token generation here (2.5 MB with its ~140 kB of norms copied out), and
# 35 MB on a CI machine whose kernel maps more per fault (33 MB with the norms copied out: what is left
# is the embedding's rows, now read from the file without a map where ``file_embedding.py`` can).
SMALL_WEIGHT_BYTES = 1 << 20


def release_mapped_weights(model: nn.Module, smaps: Path = Path("/proc/self/smaps")) -> Released:
    """Drop the resident pages of every file map the model's CPU weights still read from, or copy
    those weights out where a map cannot be dropped. A no-op where the process's maps cannot be read.

    A map whose pages were never written (no anonymous pages in it: what loading leaves) is
    advised away (``MADV_DONTNEED``): its weights stay where they are, and a page that is read
    again comes back from the page cache, the file's contents. So only the embedding rows of the
    tokens in use come back (13 MB here after a few requests, of SmolLM2's 108 MB fp32
    embedding), and workers on one machine share them. As with transformers' own loading, the
    file must not be rewritten in place while the worker runs (a download or conversion renames a
    new file into place, which leaves the mapped one alone). Weights under ``SMALL_WEIGHT_BYTES``
    (norms, biases) are copied out first, so only large ones (the embedding) read from the file. A map
    that was written to (a weight changed in place after loading) keeps its weights by copying
    them out, as does a system without ``madvise``.
    """
    import torch

    maps = _file_maps(smaps)
    if not maps:
        return Released()
    readers: dict[_FileMap, list[torch.Tensor]] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type == "cpu" and not tensor.is_mkldnn:
            found = next((vma for vma in maps if vma.start <= tensor.data_ptr() < vma.end), None)
            if found is not None:
                readers.setdefault(found, []).append(tensor)
    left, copied = 0, 0
    with torch.no_grad():
        for vma, tensors in readers.items():
            if vma.written_kb == 0:
                copied += _copy_out([tensor for tensor in tensors if _bytes(tensor) < SMALL_WEIGHT_BYTES])
                tensors = [tensor for tensor in tensors if _bytes(tensor) >= SMALL_WEIGHT_BYTES]
                if advise_dontneed(vma.start, vma.end - vma.start):
                    left += vma.resident_kb * 1024
                    continue
            copied += _copy_out(tensors)
    if left or copied:
        logger.info(
            "checkpoint map: %d MB of resident pages dropped, %d MB of weights copied out",
            left // 2**20,
            copied // 2**20,
        )
    return Released(left, copied)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _copy_out(tensors: list[torch.Tensor]) -> int:
    """Give each tensor storage of its own; returns the bytes copied."""
    for tensor in tensors:
        # ``.data`` swapped in place: a tied weight (one Parameter in two modules) stays tied.
        tensor.data = tensor.data.clone()
    return sum(_bytes(tensor) for tensor in tensors)


def return_freed_memory() -> None:
    """Ask the C allocator to return free heap memory; a no-op where it is not glibc."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return  # not glibc (musl, macOS): nothing to trim
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


@dataclass(frozen=True)
class _FileMap:
    start: int
    end: int
    resident_kb: int
    # Pages written through the map: a private map copies a page on its first write, and that copy
    # is anonymous. (Private_Dirty would also count file pages the page cache has not written back.)
    written_kb: int


def _file_maps(smaps: Path) -> list[_FileMap]:
    """This process's maps of files (a path after the inode), with their resident and written sizes."""
    try:
        lines = smaps.read_text().splitlines()
    except OSError:  # not Linux
        return []
    maps: list[_FileMap] = []
    current: list[int] | None = None  # start, end, resident kB, written kB of the map being read
    for line in [*lines, "0-0 ---p 0 0:0 0"]:  # a last header flushes the last map
        fields = line.split()
        if _is_map_header(fields):
            if current is not None:
                maps.append(_FileMap(*current))
            # address perms offset dev inode [path]; anonymous maps have inode 0 and no file path.
            is_file = len(fields) >= 6 and fields[4] != "0" and fields[5].startswith("/")
            current = [int(part, 16) for part in fields[0].split("-")] + [0, 0] if is_file else None
        elif current is not None and fields and fields[0] in ("Rss:", "Anonymous:"):
            current[2 if fields[0] == "Rss:" else 3] += int(fields[1])
    return maps


def _is_map_header(fields: list[str]) -> bool:
    return bool(fields) and "-" in fields[0] and all(char in "0123456789abcdef-" for char in fields[0])


MADV_DONTNEED = 4


def advise_dontneed(start: int, length: int) -> bool:
    """``madvise(MADV_DONTNEED)`` on ``length`` bytes from page-aligned ``start``; whether it did."""
    madvise = getattr(_libc(), "madvise", None)
    if madvise is None:
        return False
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return int(madvise(start, length, MADV_DONTNEED)) == 0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, looked up once (``find_library`` reads the loader's cache: ~1.5 ms)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None
