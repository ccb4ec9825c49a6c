"""After a burst, once the engine has idled a while, the worker gives the memory its steps freed back
to the system: once per idle spell, never while it runs, never before anything ran."""

from __future__ import annotations

import asyncio
import threading
from typing import cast

import pytest

from shared.jobs.streams import EventWriter
from tests.unit.test_concurrent_admission import WAIT_S, Events, Preparation, _job
from worker.driver import engine_driver
from worker.driver.engine_driver import DriverTuning, EngineDriver
from worker.driver.lifecycle import JobLifecycle
from worker.engine.fake import FakeEngine

IDLE_S = 0.2


async def test_the_freed_memory_goes_back_once_after_an_idle_spell(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[str] = []
    trimmed = asyncio.Event()
    loop = asyncio.get_running_loop()

    def trim() -> None:
        trims.append(threading.current_thread().name)
        loop.call_soon_threadsafe(trimmed.set)

    monkeypatch.setattr(engine_driver, "return_freed_memory", trim)
    engine = FakeEngine("some text", max_batch_size=8)
    tuning = DriverTuning(idle_trim_s=IDLE_S)
    driver = EngineDriver(
        engine, cast(JobLifecycle, Preparation()), cast(EventWriter, Events()), "m", tuning=tuning
    )
    serving = asyncio.create_task(driver.serve())
    try:
        await asyncio.sleep(3 * IDLE_S)
        assert trims == []  # nothing ran yet: start-up trims its own
        await asyncio.wait_for(driver.run(_job("first")), WAIT_S)
        assert trims == []  # not at once: a request may follow
        await asyncio.wait_for(trimmed.wait(), WAIT_S)
        assert len(trims) == 1 and trims[0].startswith("engine")  # on the compute thread, between steps
        await asyncio.sleep(3 * IDLE_S)
        assert len(trims) == 1  # once per idle spell
        trimmed.clear()
        await asyncio.wait_for(driver.run(_job("second")), WAIT_S)
        await asyncio.wait_for(trimmed.wait(), WAIT_S)
        assert len(trims) == 2
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        driver.close()
