"""Owns answering the Responses API: create (JSON, SSE, or ``background``), retrieve, cancel.

Foreground responses run through the dispatcher like chat completions; a
``background`` one is enqueued, stored as ``queued`` and answered at once, and a
runner completes it (``gateway/responses_api/store.py``); clients poll it by id. A
background one asked with ``stream`` is also streamed as it runs; leaving that
stream does not stop it. A foreground response is stored once it has finished
(unless ``store: false``), so it can be retrieved and continued: a request naming
it as ``previous_response_id`` continues its conversation (``ResponseStore.history``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sse_starlette import EventSourceResponse
from starlette.types import Receive

from gateway.access.quota import Quota, QuotaDep
from gateway.background.work import BackgroundDep
from gateway.dispatch.dispatcher import require_live
from gateway.http import sse
from gateway.http.deps import GatewayState, PrincipalDep, RequestIdDep, get_state
from gateway.responses_api import translate
from gateway.responses_api.objects import TERMINAL_RESPONSE_STATUSES, Response
from gateway.responses_api.render import ResponseStream, finished_response
from gateway.responses_api.schema import ResponseCreateRequest
from gateway.responses_api.store import ResponseStore
from shared.errors import InvalidRequest, NotFound
from shared.jobs import jobqueue
from shared.jobs.streams import StreamEvent
from shared.protocol import ChatMessage, Finished, GenerationJob


@dataclass(frozen=True, slots=True)
class ResponseService:
    """One Responses API request's answer, with what it needs of the gateway and of its caller."""

    state: GatewayState
    store: ResponseStore
    quota: Quota
    request_id: str
    tenant: str
    receive: Receive

    async def create(self, body: ResponseCreateRequest) -> Response | EventSourceResponse:
        """A response; streamed as Responses API events if asked; ``background`` answers at once."""
        if body.background and body.store is False:
            raise InvalidRequest("A background response must be stored; leave store unset.", param="store")
        created_at = time.time()
        history = await self._history(body.previous_response_id)
        # On a thread: checking a large schema would stall every stream of this gateway.
        job = await asyncio.to_thread(translate.response_job, body, self.request_id, created_at, history)
        job = await self.quota.charge(job)
        pending = translate.pending_response(body, self.request_id, created_at)
        conversation = translate.conversation(body, history)
        if body.background:
            return await self._start_background(body, job, pending, conversation)
        dispatcher = self.state.dispatcher
        if not body.stream:
            events = await dispatcher.complete(job, self.receive)
            final = finished_response(pending, events, self.request_id, time.time())
            await self._keep(final, conversation)
            return final

        async def stream(on_close: sse.OnClose) -> EventSourceResponse:
            acceptance = await dispatcher.start(job, self.receive)
            relayed = self._kept_at_end(dispatcher.relay(acceptance), pending, conversation)
            events = ResponseStream(pending, self.request_id, time.time())
            return self._stream(acceptance.accepted, relayed, events, on_close)

        return await self._open_stream(stream)

    async def _history(self, previous_response_id: str | None) -> list[ChatMessage]:
        if previous_response_id is None:
            return []
        return await self.store.history(previous_response_id, self.tenant)

    async def _keep(self, final: Response, conversation: list[ChatMessage]) -> None:
        if final.store:
            await self.store.save(self.tenant, final, self.request_id, conversation)

    async def _kept_at_end(
        self, relayed: AsyncGenerator[StreamEvent, None], pending: Response, conversation: list[ChatMessage]
    ) -> AsyncGenerator[StreamEvent, None]:
        """``relayed``, and once it has finished the response it made is stored."""
        seen = []
        async with aclosing(relayed) as events:
            async for item in events:
                seen.append(item.event)
                yield item
        if any(isinstance(event, Finished) for event in seen):
            await self._keep(finished_response(pending, seen, self.request_id, time.time()), conversation)

    async def retrieve(
        self, response_id: str, *, stream: bool, starting_after: int | None
    ) -> Response | EventSourceResponse:
        """A background response as it stands, or (``stream``) its events replayed after the
        ``starting_after``-th."""
        response = await self.store.get(response_id)
        if response is None:
            raise _missing(response_id)
        if not stream:
            return response
        request_id = await self.store.request_id(response_id)
        if request_id is None:
            raise _missing(response_id)
        is_gone = not await self.store.has_events(request_id, response.model)
        if response.status in TERMINAL_RESPONSE_STATUSES and is_gone:
            raise InvalidRequest(
                "This response's events are no longer kept; retrieve it without `stream`.", param="stream"
            )
        after = -1 if starting_after is None else starting_after
        replay = ResponseStream(translate.as_created(response), request_id, time.time(), after)

        async def replayed(on_close: sse.OnClose) -> EventSourceResponse:
            watched = self.state.dispatcher.watch(request_id, response.model)
            return self._stream(None, watched, replay, on_close)

        return await self._open_stream(replayed)

    async def cancel(self, response_id: str) -> Response:
        """Cancel a background response that has not finished; a finished one is returned as it is."""
        request_id = await self.store.request_id(response_id)
        response = await self.store.cancel(response_id)
        if response is None or request_id is None:
            raise _missing(response_id)
        if response.status == "cancelled":
            await jobqueue.abort(self.state.groups.for_model(response.model), request_id)
        return response

    async def _start_background(
        self,
        body: ResponseCreateRequest,
        job: GenerationJob,
        pending: Response,
        conversation: list[ChatMessage],
    ) -> Response | EventSourceResponse:
        job = job.model_copy(
            update={"model": await require_live(self.state.groups, body.model, job.sampling)}
        )
        if not body.stream:
            await self._enqueue_background(job, pending, conversation)
            return pending

        async def stream(on_close: sse.OnClose) -> EventSourceResponse:
            # Streamed as it runs; a client leaving does not cancel it (cancel does), and it can be polled.
            await self._enqueue_background(job, pending, conversation)
            events = ResponseStream(pending, self.request_id, time.time())
            watched = self.state.dispatcher.watch(self.request_id, job.model)
            return self._stream(None, watched, events, on_close)

        return await self._open_stream(stream)

    async def _enqueue_background(
        self, job: GenerationJob, pending: Response, conversation: list[ChatMessage]
    ) -> None:
        """Store and enqueue a background response; its job gets a deadline like every job."""
        await self.store.create(self.tenant, pending, self.request_id, conversation)
        group_pool = self.state.groups.for_model(job.model)
        await jobqueue.enqueue(group_pool, self.state.dispatcher.with_deadline(job))

    async def _open_stream(
        self, build: Callable[[sse.OnClose], Awaitable[EventSourceResponse]]
    ) -> EventSourceResponse:
        return await self.state.streams.open(self.quota.principal, self.request_id, build)

    def _stream(
        self,
        first: StreamEvent | None,
        rest: AsyncGenerator[StreamEvent, None],
        stream: ResponseStream,
        on_close: sse.OnClose,
    ) -> EventSourceResponse:
        grace_s = self.state.drain_grace_s
        return sse.event_stream(first, rest, stream.events, drain_grace_s=grace_s, on_close=on_close)


def _missing(response_id: str) -> NotFound:
    return NotFound(f"No response found with id '{response_id}'.", param="response_id")


async def get_responses(
    request: Request,
    background: BackgroundDep,
    quota: QuotaDep,
    principal: PrincipalDep,
    request_id: RequestIdDep,
) -> ResponseService:
    state = get_state(request)
    return ResponseService(state, background.responses, quota, request_id, principal.tenant, request.receive)


ResponsesDep = Annotated[ResponseService, Depends(get_responses)]
