"""The worker gives the memory its engine's steps freed back to the system: after a burst, once the
engine has idled a while (once per idle spell, never before anything ran), and while it runs, at most
once an interval (never at the first step after a trim)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
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
    tuning = DriverTuning(idle_trim_s=IDLE_S, busy_trim_s=None)
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


async def test_while_the_engine_runs_its_freed_memory_goes_back_at_most_once_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    every_s, step_s = 0.1, 0.02
    trims: list[tuple[str, float]] = []
    monkeypatch.setattr(
        engine_driver,
        "return_freed_memory",
        lambda: trims.append((threading.current_thread().name, time.monotonic())),
    )
    engine = FakeEngine("some text", step_delay_s=step_s, max_batch_size=8)
    tuning = DriverTuning(idle_trim_s=None, busy_trim_s=every_s)
    driver = EngineDriver(
        engine, cast(JobLifecycle, Preparation(tokens=20)), cast(EventWriter, Events()), "m", tuning=tuning
    )
    serving = asyncio.create_task(driver.serve())
    try:
        started = time.monotonic()
        await asyncio.wait_for(driver.run(_job("long")), WAIT_S)  # 20 steps of 20 ms at least
        assert len(trims) >= 2
        assert all(thread.startswith("engine") for thread, _ in trims)  # on the compute thread
        times = [started] + [at for _, at in trims]
        assert all(later - earlier >= every_s for earlier, later in itertools.pairwise(times))
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        driver.close()
