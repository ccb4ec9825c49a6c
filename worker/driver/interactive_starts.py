"""Owns tracking the interactive requests on their way to a first token, which batch work makes way for.

A request starts when the driver takes its job and is started once its first
token is out (or it ended). Until then it is also *arriving* while its claim,
preparation and ``Accepted`` are under way, before it reaches the engine's inbox.
What the driver and the batch lane do with this (``worker/driver/engine_driver.py``,
``worker/runtime.py``): no batch line starts and batch routing waits while any
request is starting; unless an interactive request is decoding, the next step
waits, once per request and briefly, for one that is arriving.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection


class InteractiveStarts:
    """Interactive request ids from their job's start to their first token."""

    def __init__(self) -> None:
        self._starting: set[str] = set()
        self._arriving: set[str] = set()  # not in the engine's inbox yet
        self._waited_for: set[str] = set()  # arriving ones a step has waited for already
        self._none_arriving = asyncio.Event()
        self._none_arriving.set()
        self._on_all_started: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._starting)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._starting

    def when_all_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time the last starting request has its first token."""
        self._on_all_started.append(callback)

    def begin(self, request_id: str) -> None:
        self._starting.add(request_id)
        self._arriving.add(request_id)
        self._none_arriving.clear()

    def arrived(self, request_id: str) -> None:
        """``request_id`` is in the engine's inbox (or will never be)."""
        self._arriving.discard(request_id)
        self._waited_for.discard(request_id)
        if not self._arriving:
            self._none_arriving.set()

    def started(self, request_id: str) -> None:
        """``request_id`` has its first token, or ended without one."""
        self.arrived(request_id)
        if request_id in self._starting:
            self._starting.discard(request_id)
            if not self._starting:
                for callback in self._on_all_started:
                    callback()

    def any_decoding(self, interactive_ids: Collection[str]) -> bool:
        """Whether any of ``interactive_ids`` (the driver's interactive requests) is past its start."""
        return any(request_id not in self._starting for request_id in interactive_ids)

    def awaits_a_step(self) -> bool:
        """Whether a request is arriving that no step has waited for yet."""
        return bool(self._arriving - self._waited_for)

    async def arrivals(self, at_most_s: float) -> None:
        """Wait until none is arriving, or ``at_most_s``; a step waits for each request once."""
        self._waited_for |= self._arriving
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_arriving.wait(), at_most_s)
