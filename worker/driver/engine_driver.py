"""Owns the async side of the engine: feeding it jobs, stepping it off the event loop, publishing events.

Concurrency model: one dedicated thread runs every engine call (``step()``, and the
adds and aborts between steps: ``worker/model/compute_thread.py`` says why torch must
stay on one thread); everything else (starting jobs, event routing, Redis I/O)
happens on the event loop. The engine is touched only between steps: job coroutines
put adds and aborts in an inbox that is applied before the next step, so no lock is
needed and the engine stays single-threaded. An engine whose adds and aborts may
run beside its step (vLLM's adapter: ``concurrent_admission``) gets them at once from
``worker/driver/admission.py`` instead, while its step is in flight. A step's events
go to Redis in one round trip per lane, and a request's coroutine is released only
after its terminal event is stored.
Which engine sequence belongs to which request and choice, and turning a step's
updates into events (batch-lane ones held and published merged), is
``worker/driver/routing.py``'s; it runs on the loop too, and the sequences it ends
go through the inbox. What happens to a job before it reaches the engine (claiming,
first events, resume) and when it is given back is ``worker/driver/lifecycle.py``'s;
the driver publishes fenced by the job's owner, so a job taken over elsewhere is
dropped here at its next step.

A sequence the engine could not run fails its request alone (``routing.py``); only
a step that raises fails every request (``_fail_all``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from shared.errors import WorkerFailed
from shared.jobs.streams import EventWriter
from shared.keys import Lane
from shared.protocol import Failed, GenerationJob, TokenEvent
from worker.driver.admission import ConcurrentAdmission, InboxItem, admits_concurrently
from worker.driver.held_events import HeldEvents
from worker.driver.interactive_starts import InteractiveStarts
from worker.driver.lifecycle import JobLifecycle
from worker.driver.routing import MODEL_FAILED, RequestRouter
from worker.engine import Engine, SequenceUpdate, failed_update
from worker.metrics import WorkerMetrics
from worker.model.compute_thread import compute_executor
from worker.model.freed_memory import return_freed_memory
from worker.queue.backoff import outage_delay

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DriverTuning:
    """How the step loop weighs batch work against interactive starts (measured in ``EngineDriver.serve``)."""

    # How many steps the batch lane's routing may wait for interactive requests to start: a bound,
    # so a steady stream of them delays batch lines (and their stop sequences' aborts) only so much.
    max_deferred_steps: int = 8
    # How long the next step may wait for an arriving interactive request (claimed, prepared,
    # announced: ~2-3 ms here) to join it, rather than start without it and make it wait a whole step.
    arrival_wait_s: float = 0.005
    # How long the engine must have idled after running before the freed memory of its steps goes
    # back to the system (once per idle spell; None: never). See ``EngineDriver._wait_for_work``.
    idle_trim_s: float | None = 2.0
    # While it runs, at most how often that memory goes back, before a step (None: never). See
    # ``EngineDriver._step``.
    busy_trim_s: float | None = 1.0


DEFAULT_TUNING = DriverTuning()


class EngineDriver:
    """Runs an ``Engine`` for many concurrent jobs; ``run(job)`` returns when the job has finished."""

    def __init__(
        self,
        engine: Engine,
        lifecycle: JobLifecycle,
        writer: EventWriter,
        model: str,
        metrics: WorkerMetrics | None = None,
        batch_hold_s: float = 1.0,
        tuning: DriverTuning = DEFAULT_TUNING,
    ) -> None:
        self.metrics = metrics or WorkerMetrics(model)
        self._lifecycle = lifecycle
        self._tuning = tuning
        self._engine = engine
        self._writer = writer
        self._model = model
        self._inbox: list[InboxItem] = []  # applied between steps, unless admission is concurrent
        self._starts = InteractiveStarts()  # interactive requests without their first token yet
        # the requests in the engine; their batch-lane events held and published merged
        self._requests = RequestRouter(self._post, self._starts, HeldEvents(batch_hold_s))
        self._deferred: list[list[SequenceUpdate]] = []  # batch-lane steps not routed yet, oldest first
        self._wake = asyncio.Event()
        self._trimmed = True  # nothing ran since the last trim (start-up trims its own)
        self._next_busy_trim = 0.0  # time.monotonic() from which a step trims first; 0: set by the next
        self._executor = compute_executor()
        self._admission = (
            ConcurrentAdmission(self._apply, self._wake.set) if admits_concurrently(engine) else None
        )

    @property
    def active_count(self) -> int:
        return len(self._requests)

    def active_in_lane(self, lane: str) -> int:
        return self._requests.in_lane(lane)

    @property
    def is_starting_interactive(self) -> bool:
        """Whether an interactive request waits for its first token (batch work makes way for it)."""
        return bool(self._starts)

    def when_all_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time the last starting interactive request has its first token."""
        self._starts.when_all_started(callback)

    async def run(self, job: GenerationJob) -> None:
        """Start (or resume) ``job``, stream its events, return when its terminal event is stored."""
        if job.lane != Lane.BATCH.value:
            self._starts.begin(job.request_id)
        try:
            await self._run(job)
        finally:
            self._starts.started(job.request_id)

    async def _run(self, job: GenerationJob) -> None:
        started = await self._lifecycle.start(job)
        if started is None:
            return
        if job.attempt == 0:
            self.metrics.observe_acceptance(job, started.prompt_tokens)
        done = self._requests.add(started, self._lifecycle.owner(job))
        self._starts.arrived(job.request_id)
        try:
            await done
        except asyncio.CancelledError:
            self._requests.forget(job.request_id)
            raise

    def _post(self, item: InboxItem) -> None:
        if self._admission is not None:
            self._admission.post(item)  # it wakes the step loop once the engine has the item
            return
        self._inbox.append(item)
        self._wake.set()

    async def serve(self) -> None:
        """The step loop; runs until cancelled.

        A step's interactive updates are routed and published before the next step starts.
        The batch lane's are too, except while an interactive request waits for its first
        token: then they wait (up to ``max_deferred_steps`` steps), so that request's
        prefill step starts as soon as the step in flight ends, and its claim and preparation
        do not queue behind batch routing on this loop. Nobody reads batch tokens as they
        come (``HeldEvents``), and a batch sequence stopped by a stop sequence meanwhile only
        runs a few steps too many, whose tokens its finished choice ignores. In A/B runs of
        ``bench.batch`` this took interactive TTFT beside a batch from x1.53-1.58 of idle to
        x1.35-1.39. Starting the next step before routing the last one, to overlap them,
        measured no gain: routing holds the GIL the engine thread needs. Measured again on
        2026-11-26, two runs each: served c=32 bf16 on 2 cores, 361 and 330 against 364 tok/s;
        on an H200 with CUDA graphs (``bench.device_served``), c=64 2,881 and 2,801 against
        2,636 and 2,597, c=32 1,485 and 2,567 against 1,672 and 2,173. No clear gain there
        either: the engine thread's own Python (sampling, the step's inputs) and routing take
        turns on the GIL, and a GPU step's time per token stays twice the in-process step's.

        A step also waits, once and ``arrival_wait_s`` at most, for an interactive
        request still arriving when only batch rows decode: started without it, it
        would make that request wait one more whole step. With 10 ms steps, about a third
        of requests arriving beside a batch did; the same A/B runs went from x1.42-1.52 to
        x1.17-1.29. Beside interactive streams no step waits: their next token would.
        With concurrent admission no step waits either: an arriving request reaches the
        engine whenever it comes, and ``admission.py`` runs beside this loop.
        """
        if self._admission is None:
            await self._serve_steps()
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._admission.serve())
            await self._serve_steps()

    async def _serve_steps(self) -> None:
        loop = asyncio.get_running_loop()
        last_step_end: float | None = None  # while sequences run: the time between steps is the loop's
        while True:
            await self._wait_for_work(loop)
            await self._admit_between_steps(loop)
            self.metrics.observe_engine(self._engine.stats())
            if not self._engine.has_unfinished():
                self._wake.clear()
                await self._route_deferred()
                last_step_end = None  # the engine idles: waiting for work is no gap
                continue
            started = time.perf_counter()
            if last_step_end is not None:
                self.metrics.step_gap_seconds.observe(started - last_step_end)
            self._trimmed = False
            try:
                updates = await loop.run_in_executor(self._executor, self._step)
            except Exception:
                logger.exception("engine step failed; failing its requests")
                await self._fail_all()
                last_step_end = None
                continue
            last_step_end = time.perf_counter()
            self.metrics.observe_step(last_step_end - started, updates)
            interactive, batch = self._requests.by_lane(updates)
            await self._route_and_publish(interactive)
            if batch:
                self._deferred.append(batch)
            if self._starts and len(self._deferred) < self._tuning.max_deferred_steps:
                continue  # an interactive request waits for its first token: its step comes first
            await self._route_deferred()

    def _step(self) -> list[SequenceUpdate]:
        """One engine step (on the compute thread), after returning the memory earlier steps freed
        when ``busy_trim_s`` has passed since the last such trim.

        A worker serving a steady load never idles, and between trims glibc's heaps keep what each
        prefill and step freed: a native bf16 worker serving 128 requests at c=32 peaked at
        1,049-1,078 MB without, 991-1,018 with a trim a second, at the same tok/s (the trim walks
        the heaps: ~6 ms, once a second).
        """
        every = self._tuning.busy_trim_s
        if every is not None and (now := time.monotonic()) >= self._next_busy_trim:
            if self._next_busy_trim:  # not the first step since start-up's trim or an idle one
                return_freed_memory()
            self._next_busy_trim = now + every
        return self._engine.step()

    async def _wait_for_work(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for work; once the engine has idled ``idle_trim_s`` after running, return the memory
        its steps freed to the system first, on the compute thread (so never beside a step).

        glibc keeps a burst's freed activations in its heap: a native bf16 worker held ~1,000 MB
        after 128 requests at c=32 against ~790 before them. Only after an idle spell, once: a
        trim walks the heap (~6 ms), which a request arriving meanwhile would wait for.
        """
        if self._wake.is_set() or self._trimmed or self._tuning.idle_trim_s is None:
            await self._wake.wait()
            return
        try:
            async with asyncio.timeout(self._tuning.idle_trim_s):
                await self._wake.wait()
            return
        except TimeoutError:
            pass
        self._trimmed = True
        self._next_busy_trim = 0.0  # just trimmed: the next busy trim is due a while after the next step
        await loop.run_in_executor(self._executor, return_freed_memory)
        await self._wake.wait()

    async def _admit_between_steps(self, loop: asyncio.AbstractEventLoop) -> None:
        """Apply the inbox on the compute thread, or route what concurrent admission refused."""
        if self._admission is not None:
            await self._route_and_publish(self._admission.take_refused())
            return
        if self._starts.awaits_a_step() and not self._starts.any_decoding(self._requests.interactive_ids()):
            await self._starts.arrivals(self._tuning.arrival_wait_s)
        if self._inbox:
            inbox, self._inbox = self._inbox, []  # swapped here, on the loop that appends to it
            await self._route_and_publish(await loop.run_in_executor(self._executor, self._apply, inbox))

    async def _route_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        await self._route_and_publish([update for step in deferred for update in step])

    async def _route_and_publish(self, updates: list[SequenceUpdate]) -> None:
        if not updates:
            return
        routing = time.perf_counter()
        finished, events = self._requests.route(updates)
        publishing = time.perf_counter()
        await self._publish(events)
        self.metrics.route_seconds.observe(publishing - routing)
        self.metrics.publish_seconds.observe(time.perf_counter() - publishing)
        for request_id in finished:
            self._requests.release(request_id)

    def _apply(self, inbox: list[InboxItem]) -> list[SequenceUpdate]:
        """Apply queued adds and aborts; a ``failed`` update for each request the engine refused."""
        refused: list[SequenceUpdate] = []
        for item in inbox:
            if isinstance(item, str):
                self._engine.abort(item)
                continue
            try:
                self._engine.add(item)
            except Exception:
                logger.exception("the engine refused sequence %s; failing its request alone", item.request_id)
                refused.append(failed_update(item.request_id))
        return refused

    async def _publish(self, events: list[tuple[str, TokenEvent]]) -> None:
        """Publish one step's events, retrying through short Redis outages so nothing is lost."""
        owners = self._requests.owners(events)
        number = self._writer.next_publish()  # the same on every try: a retry stores nothing twice
        attempt = 0
        while True:
            try:
                lost = await self._writer.publish_owned(
                    events, owners=owners, model=self._model, number=number
                )
                self.metrics.observe_outcomes(event for request_id, event in events if request_id not in lost)
                self._drop_lost(lost)
                return
            except RedisError as error:
                # The engine does not step meanwhile: generation pauses instead of dropping tokens.
                delay = outage_delay(attempt)
                logger.warning("publishing a step failed (%s); retrying in %.2f s", error, delay)
                await asyncio.sleep(delay)
                attempt += 1

    def _drop_lost(self, request_ids: set[str]) -> None:
        """Stop jobs another worker took over (our lease lapsed): their stream is no longer ours."""
        for request_id in request_ids:
            logger.warning("lost request %s to a takeover; dropping it here", request_id)
            self._requests.forget(request_id, release=True)

    async def _fail_all(self) -> None:
        failure = Failed(error=WorkerFailed(MODEL_FAILED).to_info())
        request_ids = self._requests.request_ids()
        engine_ids = [
            engine_id for request_id in request_ids for engine_id in self._requests.abandon(request_id)
        ]
        await asyncio.get_running_loop().run_in_executor(self._executor, self._abort_all, engine_ids)
        await self._publish([(request_id, failure) for request_id in request_ids])
        for request_id in request_ids:
            self._requests.release(request_id)

    def _abort_all(self, engine_ids: list[str]) -> None:
        for engine_id in engine_ids:
            self._engine.abort(engine_id)

    def close(self) -> None:
        if self._admission is not None:
            self._admission.close()
        self._engine.close()
