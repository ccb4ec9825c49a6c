"""Owns the one thread that runs torch in a worker process: loading, warm-up, every engine call.

Why one: torch's CPU wheels use GNU OpenMP, which gives each thread that opens a
parallel region a team of its own, and spins its idle workers only briefly
(1,000 spins instead of 300,000) once the process holds more OpenMP threads than
it has cores. A model loaded on one thread and stepped on another therefore pays a
futex wake-up on every op. Measured on this 2-core AMD EPYC, SmolLM2-135M fp32, one
row: a oneDNN-packed ``[1, 576] x [576, 1536]`` linear took 45 us on the thread that
alone ran torch and 100 us on a second thread (or on the first again, once the second
had run); the engine's decode step, 36 ms on the loading thread and 47 ms on another
(1.98 against 1.37 cores busy). Everything torch runs in the worker therefore runs
here, and nowhere else: nothing on the event loop may call into an engine directly.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache


@cache
def compute_executor() -> ThreadPoolExecutor:
    """The process's torch thread (created on first use, lives as long as the process)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
