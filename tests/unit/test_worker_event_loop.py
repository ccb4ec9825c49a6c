"""The worker process runs its queue consumers, routing and publishing on uvloop, as the gateway does."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from shared.settings import WorkerSettings
from worker import main


def test_the_worker_process_runs_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    class _Consumer:
        def run(self) -> None:  # arq's Worker.run takes the current loop
            loops.append(asyncio.get_event_loop())

    monkeypatch.setattr(main, "build_worker", lambda settings: _Consumer())
    try:
        main.run_worker(WorkerSettings(engine="fake", model="m"))
    finally:
        for loop in loops:
            loop.close()
        asyncio.set_event_loop(None)
    assert len(loops) == 1 and isinstance(loops[0], uvloop.Loop)
