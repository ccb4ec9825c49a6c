"""Memory freed at start-up goes back to the system: the worker's resident size drops after a trim."""

from __future__ import annotations

import ctypes
from pathlib import Path

from worker.model.freed_memory import return_freed_memory


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
