"""Owns handing adds and aborts to an engine while its step is in flight (``concurrent_admission``).

The native engine is touched only between steps, on the compute thread (``engine_driver.py``).
vLLM's adapter waits in ``step`` for a core that runs in another process; an add queued
until that wait ends reaches vLLM's scheduler one step late (+~100 ms TTFT at 32 streams,
~2-3 % throughput, measured against vLLM's own server). An engine that says its ``add``
and ``abort`` may run beside ``step`` gets them here at once: applied in posting order on
a thread of their own, not on the event loop (an add runs vLLM's input processor, a few
hundred µs, and may wait for the engine's lock) and not on the compute thread (busy in
``step``). Refused adds are kept for the step loop to route, so routing stays on one
coroutine, and ``on_applied`` wakes that loop, which may have gone idle meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from worker.engine import Engine, EngineRequest, SequenceUpdate

InboxItem = EngineRequest | str  # a request to add, or an id to abort
Apply = Callable[[list[InboxItem]], list[SequenceUpdate]]


def admits_concurrently(engine: Engine) -> bool:
    """Whether ``engine`` lets ``add`` and ``abort`` run while its ``step`` does (False unless it says so)."""
    return bool(getattr(engine, "concurrent_admission", False))


class ConcurrentAdmission:
    """Applies posted adds and aborts on a thread of its own while ``serve`` runs."""

    def __init__(self, apply: Apply, on_applied: Callable[[], None]) -> None:
        self._apply = apply
        self._on_applied = on_applied
        self._pending: list[InboxItem] = []
        self._refused: list[SequenceUpdate] = []
        self._posted = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="admission")

    def post(self, item: InboxItem) -> None:
        self._pending.append(item)
        self._posted.set()

    def take_refused(self) -> list[SequenceUpdate]:
        """The ``failed`` updates of adds the engine refused since the last call."""
        refused, self._refused = self._refused, []
        return refused

    async def serve(self) -> None:
        """Apply what is posted, in order, as it comes; runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await self._posted.wait()
            self._posted.clear()
            batch, self._pending = self._pending, []  # swapped on the loop that appends to it
            self._refused += await loop.run_in_executor(self._executor, self._apply, batch)
            self._on_applied()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
