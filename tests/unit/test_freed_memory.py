"""Memory the worker no longer needs after start-up goes back to the system: freed heap blocks after a
trim, and the checkpoint's memory map once no weight reads from it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import nn

from worker.model.freed_memory import (
    Released,
    _file_maps,
    _FileMap,
    release_mapped_weights,
    return_freed_memory,
)


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


ROWS = 256  # a 1 MiB weight: large enough to be left to the file


def _mapped_model(path: Path) -> tuple[nn.ModuleDict, nn.Parameter]:
    """What transformers leaves after loading safetensors: parameters that are views of the mapped
    file, here a tied 1 MiB embedding and a 4 kB norm."""
    values = ROWS * 1024 + 1024
    path.write_bytes(torch.arange(values, dtype=torch.float32).numpy().tobytes())
    mapped = torch.from_file(str(path), shared=False, size=values, dtype=torch.float32)
    embedding, head = nn.Embedding(ROWS, 1024), nn.Linear(1024, ROWS, bias=False)
    weight = nn.Parameter(mapped[: ROWS * 1024].view(ROWS, 1024), requires_grad=False)
    embedding.weight = head.weight = weight  # tied, as a small LM's are
    norm = nn.LayerNorm(1024, elementwise_affine=True)
    norm.weight = nn.Parameter(mapped[ROWS * 1024 :], requires_grad=False)
    return nn.ModuleDict({"embedding": embedding, "head": head, "norm": norm}), weight


def test_a_map_nothing_wrote_to_drops_its_pages_and_its_weights_stay_readable(tmp_path: Path) -> None:
    model, weight = _mapped_model(tmp_path / "weights.bin")
    assert float(weight.sum()) > 0 and float(model["norm"].weight.sum()) > 0  # read: resident
    assert _map_of(weight.data_ptr()).resident_kb == (ROWS + 1) * 4

    released = release_mapped_weights(model)

    # The norm's 4 kB are copied out: read through the map, each such weight would cost a page or more.
    assert released == Released(left_to_file=(ROWS + 1) * 4 * 1024, copied=4 * 1024)
    assert _map_of(model["norm"].weight.data_ptr()) is None
    assert _map_of(weight.data_ptr()).resident_kb == 0  # nothing resident, the weight still in the file
    assert torch.equal(weight, torch.arange(ROWS * 1024, dtype=torch.float32).view(ROWS, 1024))  # read back
    norm_values = torch.arange(ROWS * 1024, ROWS * 1024 + 1024, dtype=torch.float32)
    assert torch.equal(model["norm"].weight, norm_values)


def test_a_map_written_to_keeps_its_weights_by_copying_them_out(tmp_path: Path) -> None:
    model, weight = _mapped_model(tmp_path / "weights.bin")
    with torch.no_grad():
        weight[0, 0] = -1.0  # changed in place after loading: the file no longer holds it
    address = weight.data_ptr()

    released = release_mapped_weights(model)

    assert released == Released(left_to_file=0, copied=(ROWS + 1) * 1024 * 4)  # the norm's bias stays
    assert _map_of(weight.data_ptr()) is None and weight.data_ptr() != address
    assert model["embedding"].weight is model["head"].weight  # still one tied parameter
    expected = torch.arange(ROWS * 1024, dtype=torch.float32).view(ROWS, 1024)
    expected[0, 0] = -1.0
    assert torch.equal(weight, expected)


def _map_of(address: int) -> _FileMap | None:
    return next((vma for vma in _file_maps(Path("/proc/self/smaps")) if vma.start <= address < vma.end), None)
