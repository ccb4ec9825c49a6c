"""The interactive requests batch work makes way for: from their job's start to their first token."""

from __future__ import annotations

import asyncio
import time

from worker.driver.interactive_starts import InteractiveStarts


def test_the_callback_runs_when_the_last_starting_request_has_its_first_token() -> None:
    starts = InteractiveStarts()
    calls: list[int] = []
    starts.when_all_started(lambda: calls.append(len(starts)))
    starts.begin("a")
    starts.begin("b")
    starts.started("a")
    assert calls == [] and "b" in starts and len(starts) == 1
    starts.started("b")
    starts.started("b")  # a second end (its run's own) changes nothing
    assert calls == [0] and not starts


def test_a_step_waits_for_each_admitting_request_once() -> None:
    starts = InteractiveStarts()
    starts.begin("a")
    assert starts.awaits_a_step()

    async def wait_once() -> float:
        began = time.monotonic()
        await starts.arrivals(at_most_s=0.05)
        return time.monotonic() - began

    assert asyncio.run(wait_once()) >= 0.04  # still admitting: the wait ran out
    assert not starts.awaits_a_step()  # "a" had its wait
    starts.begin("b")
    assert starts.awaits_a_step()
    starts.arrived("a")
    starts.arrived("b")
    assert not starts.awaits_a_step() and "a" in starts  # admitted, still without a first token


def test_a_wait_ends_as_soon_as_the_request_is_admitted() -> None:
    async def scenario() -> float:
        starts = InteractiveStarts()
        starts.begin("a")
        asyncio.get_running_loop().call_later(0.01, starts.arrived, "a")
        began = time.monotonic()
        await starts.arrivals(at_most_s=5.0)
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 1.0


def test_decoding_means_past_its_start() -> None:
    starts = InteractiveStarts()
    starts.begin("a")
    assert not starts.any_decoding(["a"])
    starts.started("a")
    assert starts.any_decoding(["a"])
