"""Memory the worker no longer needs after start-up goes back to the system: freed heap blocks after a
trim, and the checkpoint's memory map once no weight reads from it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import nn

from worker.model.freed_memory import own_mapped_weights, return_freed_memory


def _resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_freed_heap_blocks_go_back_to_the_system() -> None:
    # Blocks below glibc's mmap threshold live in its heap. Freed below a block still in use (as
    # a loaded model's copies are), glibc keeps them resident until it is asked to trim.
    blocks = [ctypes.create_string_buffer(64 * 1024) for _ in range(3000)]  # ~190 MB, touched (zeroed)
    in_use = ctypes.create_string_buffer(64 * 1024)
    held = _resident_mb()
    del blocks
    assert _resident_mb() > held - 50  # freed, yet still resident
    return_freed_memory()
    assert _resident_mb() < held - 100
    assert in_use.raw == bytes(64 * 1024)


def test_weights_still_read_from_a_mapped_file_move_into_memory_of_their_own(tmp_path: Path) -> None:
    # What transformers leaves after loading safetensors: parameters that are views of the mapped file.
    path = tmp_path / "weights.bin"
    path.write_bytes(torch.arange(4 * 8, dtype=torch.float32).numpy().tobytes())
    mapped = torch.from_file(str(path), shared=False, size=4 * 8, dtype=torch.float32).view(4, 8)
    embedding, head = nn.Embedding(4, 8), nn.Linear(8, 4, bias=False)
    embedding.weight = head.weight = nn.Parameter(mapped, requires_grad=False)  # tied, as a small LM's are
    model = nn.ModuleDict({"embedding": embedding, "head": head, "norm": nn.LayerNorm(8)})
    assert _is_file_mapped(head.weight.data_ptr())

    copied = own_mapped_weights(model)

    assert copied == 4 * 8 * 4  # the mapped weight only: the norm's own parameters stay where they are
    assert not _is_file_mapped(head.weight.data_ptr())
    assert embedding.weight is head.weight  # still one tied parameter
    assert torch.equal(head.weight, torch.arange(4 * 8, dtype=torch.float32).view(4, 8))
    assert own_mapped_weights(model) == 0


def _is_file_mapped(address: int) -> bool:
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(part, 16) for part in fields[0].split("-"))
        if start <= address < end:
            return len(fields) == 6 and fields[5].startswith("/")
    return False
