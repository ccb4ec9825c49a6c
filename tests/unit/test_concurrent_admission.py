"""The driver hands adds to an engine with ``concurrent_admission`` while its step is in flight,
and to any other engine only between steps, on the compute thread.

No Redis: the job's preparation and the event writer are stand-ins, the engine the fake,
whose first step blocks until the test lets it go."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import cast

import pytest

from shared.jobs.streams import EventWriter
from shared.protocol import GenerationJob, TextPrompt, TokenEvent
from worker.driver.engine_driver import EngineDriver
from worker.driver.lifecycle import JobLifecycle, StartedJob
from worker.engine import EngineRequest, SamplingParams, SequenceUpdate
from worker.engine.fake import ByteTokenizer, FakeEngine
from worker.requests.choices import RequestChoices

WAIT_S = 5.0


class GatedEngine(FakeEngine):
    """The fake engine, whose first step waits for ``release``; it notes which thread added what."""

    def __init__(self, *, concurrent: bool) -> None:
        super().__init__("gated text", max_batch_size=8)
        self.concurrent_admission = concurrent
        self.stepping = threading.Event()
        self.release = threading.Event()
        self.added: dict[str, threading.Event] = {}
        self.adders: dict[str, str] = {}
        self.added_in_step: list[str] = []

    def add(self, request: EngineRequest) -> None:
        if self.stepping.is_set() and not self.release.is_set():
            self.added_in_step.append(request.request_id)
        self.adders[request.request_id] = threading.current_thread().name
        super().add(request)
        self.added.setdefault(request.request_id, threading.Event()).set()

    def step(self) -> list[SequenceUpdate]:
        self.stepping.set()
        self.release.wait(WAIT_S)
        return super().step()

    def wait_added(self, request_id: str) -> bool:
        return self.added.setdefault(request_id, threading.Event()).wait(WAIT_S)


class Preparation:
    """Stands in for ``JobLifecycle``: every job runs one choice of ``tokens`` tokens of a fixed
    prompt (none for a job named ``refused``: the fake engine refuses that one)."""

    def __init__(self, tokens: int = 3) -> None:
        self.started: dict[str, asyncio.Event] = {}
        self.tokens = tokens  # each choice's max_new_tokens

    def owner(self, job: GenerationJob) -> str:
        return "owner"

    async def posted(self, request_id: str) -> None:
        """Wait until the driver has posted ``request_id``'s add (it does so as ``start`` returns)."""
        await asyncio.wait_for(self.started.setdefault(request_id, asyncio.Event()).wait(), WAIT_S)

    async def start(self, job: GenerationJob) -> StartedJob:
        max_new_tokens = 0 if job.request_id == "refused" else self.tokens
        request = EngineRequest(job.request_id, (72, 105), SamplingParams(), max_new_tokens, frozenset())
        choices = RequestChoices.start(ByteTokenizer(), (request,), ())
        self.started.setdefault(job.request_id, asyncio.Event()).set()
        return StartedJob(job, choices, (job.request_id,), (request,), prompt_tokens=2)


class Events:
    """Stands in for ``EventWriter``: keeps what would be published."""

    def __init__(self) -> None:
        self.published: list[tuple[str, TokenEvent]] = []

    def next_publish(self) -> int:
        return 0

    async def publish_owned(
        self,
        events: Sequence[tuple[str, TokenEvent]],
        *,
        owners: Mapping[str, str],
        model: str,
        number: int = 0,
    ) -> set[str]:
        self.published += events
        return set()


@asynccontextmanager
async def serving(engine: GatedEngine, preparation: Preparation | None = None) -> AsyncIterator[EngineDriver]:
    lifecycle = cast(JobLifecycle, preparation or Preparation())
    driver = EngineDriver(engine, lifecycle, cast(EventWriter, Events()), "m", batch_hold_s=0.0)
    loop_task = asyncio.create_task(driver.serve())
    try:
        yield driver
    finally:
        engine.release.set()  # never leave the process's compute thread blocked
        loop_task.cancel()
        await asyncio.gather(loop_task, return_exceptions=True)
        driver.close()


def _job(request_id: str) -> GenerationJob:
    return GenerationJob(
        request_id=request_id, model="m", prompt=TextPrompt(text="hi"), created_at=time.time()
    )


async def _in_thread(wait: Callable[[], bool]) -> bool:
    return await asyncio.to_thread(wait)


async def test_an_engine_with_concurrent_admission_gets_an_add_while_its_step_is_in_flight() -> None:
    engine = GatedEngine(concurrent=True)
    async with serving(engine) as driver:
        first = asyncio.create_task(driver.run(_job("first")))  # the idle loop wakes for it
        assert await _in_thread(lambda: engine.stepping.wait(WAIT_S))
        second = asyncio.create_task(driver.run(_job("second")))
        assert await _in_thread(lambda: engine.wait_added("second"))
        assert engine.added_in_step == ["second"]
        assert engine.adders["second"].startswith("admission")
        engine.release.set()
        await asyncio.wait_for(asyncio.gather(first, second), WAIT_S)
    assert not engine.has_unfinished()


async def test_an_engine_without_it_gets_adds_only_between_steps_on_the_compute_thread() -> None:
    engine = GatedEngine(concurrent=False)
    preparation = Preparation()
    async with serving(engine, preparation) as driver:
        first = asyncio.create_task(driver.run(_job("first")))
        assert await _in_thread(lambda: engine.stepping.wait(WAIT_S))
        second = asyncio.create_task(driver.run(_job("second")))
        await preparation.posted("second")  # to the inbox, which waits for the step in flight
        engine.release.set()
        await asyncio.wait_for(asyncio.gather(first, second), WAIT_S)
    assert engine.added_in_step == []
    assert {engine.adders["first"][:6], engine.adders["second"][:6]} == {"engine"}


@pytest.mark.parametrize("concurrent", [True, False])
async def test_a_refused_add_fails_its_request_alone(concurrent: bool) -> None:
    engine = GatedEngine(concurrent=concurrent)
    engine.release.set()
    async with serving(engine) as driver:
        await asyncio.wait_for(driver.run(_job("refused")), WAIT_S)  # failed, and released
        await asyncio.wait_for(driver.run(_job("ok")), WAIT_S)
    published = cast(Events, driver._writer).published
    assert [(request_id, event.type) for request_id, event in published if request_id == "refused"] == [
        ("refused", "failed")
    ]
    assert ("ok", "finished") in [(request_id, event.type) for request_id, event in published]
