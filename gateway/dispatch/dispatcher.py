"""Owns one request's job from the gateway's side: submitting it (enqueue, acceptance), its events, its abort.

The flow: refuse a model nobody serves (404) or nobody serves right now (503);
enqueue the job; wait for the worker's first event, which is ``accepted`` or
``failed``. A failure there (the prompt is too long, say) is raised as its domain
error, so the client gets a plain HTTP 4xx before any SSE byte exists. After
acceptance the caller either collects the events into one object or relays them.
Every stream is read through the gateway's few shared stream readers
(``shared/jobs/stream_mux.py``), so an open stream holds no Redis connection of its own.
A job's queue, stream and abort are in its model group's Redis (``gateway/dispatch/groups.py``):
each group has its own readers, and every call here names the model it is about.

Whenever we stop listening before the job's terminal event (the client went
away, the deadline passed, Redis failed, a bug), the job is aborted, so its batch
slot is freed within a decode step. The abort runs shielded: it must complete
even while the task that asks for it is being cancelled, which is exactly when it
is needed. Both kinds of shield are used: anyio's, because sse-starlette cancels
with anyio cancel scopes that re-deliver cancellation at every await, and
asyncio's, because a plain ``Task.cancel()`` goes straight through anyio's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Coroutine
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from redis.exceptions import RedisError
from starlette.types import Receive

from gateway.dispatch.groups import GroupPools
from gateway.http.errors import unknown_model
from gateway.http.shutdown import server_is_stopping
from gateway.ops.metrics import note_event, note_model
from shared import engines, keys, registry
from shared.errors import NoLiveWorker, Overloaded, TokenferryError, WorkerFailed, error_from_info
from shared.jobs import jobqueue
from shared.jobs.arq_seam import QueuePool
from shared.jobs.stream_mux import StreamMux
from shared.jobs.streams import EventReader, StreamEvent
from shared.protocol import (
    TERMINAL_EVENT_TYPES,
    Accepted,
    Failed,
    Finished,
    GenerationJob,
    SamplingSpec,
    TokenEvent,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
# An abort is one ZADD; if Redis cannot take it in this long, it cannot take it at all.
ABORT_TIMEOUT_S = 2.0


class ClientDisconnected(TokenferryError):
    """The client closed the connection before its answer was ready (nginx's 499)."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


@dataclass(frozen=True, slots=True)
class Acceptance:
    """A job its worker accepted, with where its event stream goes on from."""

    job: GenerationJob
    accepted: StreamEvent
    deadline: float
    enqueued_at: float


@dataclass(frozen=True, slots=True)
class _GroupLink:
    """One model group's Redis as the dispatcher uses it."""

    pool: QueuePool
    reader: EventReader
    streams: StreamMux


class Dispatcher:
    """Runs jobs for request handlers; one per gateway process, built by the lifespan."""

    def __init__(
        self, pools: GroupPools, timeout_s: float, max_queued: int = 256, *, stream_readers: int = 4
    ) -> None:
        self._pools = pools
        self._timeout_s = timeout_s
        self._max_queued = max_queued
        # Every relayed stream is read through a few connections per group, none held per request.
        self._links = {
            url: _GroupLink(pool, EventReader(pool), StreamMux(pool, readers=stream_readers))
            for url, pool in pools.by_url().items()
        }

    async def aclose(self) -> None:
        """Stop relaying (the lifespan's end: no request is left to read a stream)."""
        for link in self._links.values():
            await link.streams.aclose()

    def _link(self, model: str) -> _GroupLink:
        return self._links[self._pools.url_for(model)]

    async def start(self, job: GenerationJob, receive: Receive) -> Acceptance:
        """Submit ``job`` (for streaming), aborting it if the client leaves while it waits."""
        return await unless_disconnected(self._submit(job), receive)

    async def complete(self, job: GenerationJob, receive: Receive) -> list[TokenEvent]:
        """Submit ``job`` and collect all its events (Accepted ... Finished), watching the client."""
        return await unless_disconnected(self._submit_and_collect(job), receive)

    async def submit(self, job: GenerationJob) -> Acceptance:
        """Submit ``job`` without watching the client: for callers running several jobs (``fanout.py``)."""
        return await self._submit(job)

    async def collect(self, job: GenerationJob) -> list[TokenEvent]:
        """Submit ``job`` and collect all its events, without watching the client (``fanout.py``)."""
        return await self._submit_and_collect(job)

    async def relay(self, acceptance: Acceptance) -> AsyncGenerator[StreamEvent, None]:
        """The events after Accepted through Finished; Failed is raised; leaving early aborts."""
        job, after_id = acceptance.job, acceptance.accepted.entry_id
        follow = self._follow(
            job.request_id, job.model, after_id, acceptance.deadline, acceptance.enqueued_at
        )
        async with aclosing(follow) as events:
            async for item in events:
                yield item

    async def relay_batches(self, acceptance: Acceptance) -> AsyncGenerator[list[StreamEvent], None]:
        """``relay``'s events, each time as all of them that have arrived (an SSE relay writes them
        at once); leaving early aborts."""
        job, after_id = acceptance.job, acceptance.accepted.entry_id
        follow = self._follow_batches(
            job.request_id, job.model, after_id, acceptance.deadline, acceptance.enqueued_at
        )
        async with aclosing(follow) as batches:
            async for batch in batches:
                yield batch

    async def follow(
        self, request_id: str, model: str, after_id: str
    ) -> AsyncGenerator[list[StreamEvent], None]:
        """A running request's events after ``after_id`` (a resumed SSE stream), in batches as
        ``relay_batches``; leaving early aborts."""
        now = time.monotonic()
        follow = self._follow_batches(request_id, model, after_id, now + self._timeout_s, now)
        async with aclosing(follow) as batches:
            async for batch in batches:
                yield batch

    async def watch(self, request_id: str, model: str) -> AsyncGenerator[StreamEvent, None]:
        """Every event of a job this request does not own (a background one: a runner does), Failed
        raised; leaving early leaves the job running."""
        deadline = time.monotonic() + self._timeout_s
        async with aclosing(self._link(model).streams.read(request_id, deadline=deadline)) as events:
            async for item in events:
                if isinstance(item.event, Failed):
                    raise error_from_info(item.event.error)
                yield item

    def with_deadline(self, job: GenerationJob) -> GenerationJob:
        """``job`` with its deadline, the request timeout from now, for workers: a job that waited
        past it is answered (504), not started. Every job gets one, background ones included."""
        return job.model_copy(update={"deadline_at": time.time() + self._timeout_s})

    async def history(self, request_id: str, model: str) -> list[StreamEvent]:
        return await self._link(model).reader.history(request_id)

    async def _follow(
        self, request_id: str, model: str, after_id: str, deadline: float, started_at: float
    ) -> AsyncGenerator[StreamEvent, None]:
        batches = self._follow_batches(request_id, model, after_id, deadline, started_at)
        async with aclosing(batches) as relayed:
            async for batch in relayed:
                for item in batch:
                    yield item

    async def _follow_batches(
        self, request_id: str, model: str, after_id: str, deadline: float, started_at: float
    ) -> AsyncGenerator[list[StreamEvent], None]:
        is_over = False
        try:
            reads = self._link(model).streams.read_batches(request_id, deadline=deadline, after_id=after_id)
            async with aclosing(reads) as batches:
                async for batch in batches:
                    for item in batch:
                        note_event(item.event)
                        _note_terminal(started_at, item.event)
                    is_over = batch[-1].event.type in TERMINAL_EVENT_TYPES
                    yield batch
        except BaseException as exc:  # GeneratorExit and CancelledError included: the client left
            if is_over:
                raise
            if server_is_stopping():
                # Our drain ran out, not the client: it may resume elsewhere with Last-Event-ID.
                logger.info("left running for a resume on another gateway")
            else:
                await self.abort(request_id, model=model, reason=type(exc).__name__)
            raise

    async def abort(self, request_id: str, *, model: str, reason: str) -> None:
        """Ask ``model``'s worker to drop ``request_id``; completes even while the caller is cancelled."""
        logger.info("aborted (%s)", reason)
        with anyio.move_on_after(ABORT_TIMEOUT_S, shield=True):
            try:
                await asyncio.shield(jobqueue.abort(self._pools.for_model(model), request_id))
            except RedisError as error:
                logger.warning("abort not delivered: %s", error)

    async def _submit_and_collect(self, job: GenerationJob) -> list[TokenEvent]:
        acceptance = await self._submit(job)
        events: list[TokenEvent] = [acceptance.accepted.event]
        async with aclosing(self.relay(acceptance)) as relayed:
            events.extend([item.event async for item in relayed])
        return events

    async def _submit(self, job: GenerationJob) -> Acceptance:
        job = job.model_copy(update={"model": await require_live(self._pools, job.model, job.sampling)})
        note_model(job.model)
        enqueued_at = time.monotonic()
        deadline = enqueued_at + self._timeout_s
        job = self.with_deadline(job)
        first = await self._enqueue_and_wait(job, deadline)
        if isinstance(first.event, Failed):
            _log_failed(first.event)
            raise error_from_info(first.event.error)
        if not isinstance(first.event, Accepted):
            await self.abort(job.request_id, model=job.model, reason="protocol violation")
            raise WorkerFailed(f"the worker's first event was {first.event.type!r}, not 'accepted'")
        logger.info(
            "accepted worker=%s prompt_tokens=%d after %.3fs",
            first.event.worker_id,
            first.event.prompt_tokens,
            time.monotonic() - enqueued_at,
        )
        return Acceptance(job=job, accepted=first, deadline=deadline, enqueued_at=enqueued_at)

    async def _refuse_when_overloaded(self, job: GenerationJob, ahead: int) -> None:
        """Refuse (429) a just-enqueued job with ``max_queued`` others waiting ahead of it.

        Checked after enqueueing, by position, so a burst arriving at once is cut at
        the bound exactly rather than all passing a check made before any enqueued.
        """
        if ahead >= self._max_queued:
            # Withdrawn unclaimed, the job leaves nothing behind; only a claimed one needs an abort.
            pool = self._pools.for_model(job.model)
            if not await jobqueue.withdraw(pool, job.model, job.request_id, keys.Lane(job.lane)):
                await self.abort(job.request_id, model=job.model, reason="queue full")
                await jobqueue.forget(pool, job.model, job.request_id)
            raise Overloaded(
                f"The model `{job.model}` has {ahead} requests waiting already; retry shortly.",
                retry_after_s=1,
            )

    async def _enqueue_and_wait(self, job: GenerationJob, deadline: float) -> StreamEvent:
        """Enqueue ``job`` and return its first event; any failure on the way aborts it."""
        try:
            link = self._link(job.model)
            ahead = await jobqueue.enqueue(link.pool, job)
            logger.info("enqueued model=%s behind %d", job.model, ahead)
            await self._refuse_when_overloaded(job, ahead)
            async with aclosing(link.streams.read(job.request_id, deadline=deadline)) as events:
                async for item in events:
                    return item
        except BaseException as exc:  # cancellation included: the job may be queued already
            await self.abort(
                job.request_id, model=job.model, reason=f"{type(exc).__name__} before acceptance"
            )
            raise
        raise WorkerFailed("the event stream ended before its first event")


async def require_live(pools: GroupPools, model: str, sampling: SamplingSpec | None = None) -> str:
    """The canonical model ``model`` names (itself, or the model it is an alias of), to enqueue on.

    404 for a name nobody ever served, 503 for one whose workers are all gone right now; the
    model's group says both (its workers register there), the 404 lists every group's names.
    400 for ``sampling`` asking what the workers' engine cannot honour (``shared/engines.py``).
    """
    availability, info = await registry.model_availability(pools.for_model(model), model)
    if info is not None:
        if sampling is not None:
            engines.refuse(sampling, info.refuses, info.engine, info.model)
        return info.model
    if availability is registry.ModelAvailability.UNKNOWN:
        raise unknown_model(model, registry.served_names(await pools.live_workers()))
    raise NoLiveWorker(f"No worker is serving the model `{model}` right now; retry shortly.", param="model")


async def unless_disconnected(work: Coroutine[Any, Any, _T], receive: Receive) -> _T:
    """Await ``work`` unless the client disconnects first: then cancel it and raise ClientDisconnected.

    Servers do not cancel a handler when its client goes, so without this a
    non-streaming request would keep its batch slot until the answer is complete.
    """
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait((work_task, watch_task), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        work_task.cancel()  # a no-op once done; otherwise the job's cleanup aborts it
        # Wait for both, so the abort has been sent before we answer or propagate.
        await asyncio.wait((work_task, watch_task))
    if work_task.cancelled():
        raise ClientDisconnected("The client closed the connection before the answer was ready.")
    return work_task.result()


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # a stray body message; the request body was already read


def _note_terminal(started_at: float, event: TokenEvent) -> None:
    """Log a terminal event; raise a Failed one as its domain error."""
    if isinstance(event, Failed):
        _log_failed(event)
        raise error_from_info(event.error)
    if isinstance(event, Finished):
        logger.info(
            "finished reason=%s prompt_tokens=%d completion_tokens=%d in %.3fs",
            event.finish_reason,
            event.usage.prompt_tokens,
            event.usage.completion_tokens,
            time.monotonic() - started_at,
        )


def _log_failed(event: Failed) -> None:
    logger.info("failed status=%d code=%s: %s", event.error.status, event.error.code, event.error.message)
