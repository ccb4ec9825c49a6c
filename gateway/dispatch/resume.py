"""Owns resuming a stream on any gateway: what a stream looked like, and replaying it from Last-Event-ID.

Every streamed response's SSE events carry ``id:`` = the Redis stream entry id of
the event they came from (``gateway/http/sse.py``). When a client loses its gateway
it calls ``GET /v1/requests/{request_id}/stream`` on any gateway with the header
``Last-Event-ID`` (the request id is the ``x-request-id`` of the original answer).
That gateway needs to render the same chunks the first one did, so each stream's
"view" (chat or text completion, its response metadata, its tenant) is stored
when the stream starts. The renderer is rebuilt by feeding it the events the
client already has (its chunk state, such as which choices have ended, then
matches), and the stream goes on after the given id: nothing lost, nothing twice.
The view is kept in the home Redis (it is the tenant's: its owner is checked), and it
names the model, whose group's Redis holds the stream itself (``gateway/dispatch/groups.py``):
so any gateway finds a request's group from its id alone.
``Resumer`` does that for the route (``gateway/dispatch/routes.py``).
"""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Annotated, Any, Literal

from fastapi import Depends, Request
from pydantic import BaseModel
from redis.asyncio import Redis
from sse_starlette import EventSourceResponse

from gateway.access.auth import Principal
from gateway.access.stream_slots import StreamSlots
from gateway.dispatch.dispatcher import Dispatcher
from gateway.http import sse
from gateway.http.deps import get_state
from gateway.openai.render import ChatStream, CompletionStream, ResponseMeta
from shared import keys
from shared.errors import InvalidRequest, NotFound
from shared.jobs.streams import StreamEvent
from shared.protocol import TERMINAL_EVENT_TYPES, TokenEvent

StreamKind = Literal["chat", "completion"]


class StreamView(BaseModel):
    kind: StreamKind
    meta: dict[str, Any]
    tenant: str

    @property
    def model(self) -> str:
        """The model the stream's request named: its group's Redis holds the stream."""
        return str(self.meta["model"])

    def renderer(self) -> Callable[[TokenEvent], Sequence[BaseModel]]:
        meta = ResponseMeta(**self.meta)
        return ChatStream(meta).chunks if self.kind == "chat" else CompletionStream(meta).chunks


async def save_view(redis: Redis, request_id: str, kind: StreamKind, meta: ResponseMeta, tenant: str) -> None:
    view = StreamView(kind=kind, meta=dataclasses.asdict(meta), tenant=tenant)
    await redis.set(keys.request_view(request_id), view.model_dump_json(), ex=keys.EVENTS_RUNNING_TTL_S)


async def load_view(redis: Redis, request_id: str, tenant: str) -> StreamView:
    """The view of a stream this tenant started; 404 for anything else (no existence leak)."""
    raw = await redis.get(keys.request_view(request_id))
    view = None if raw is None else StreamView.model_validate_json(raw)
    if view is None or not hmac.compare_digest(view.tenant.encode(), tenant.encode()):
        raise NotFound(f"No resumable stream with id {request_id!r}.", param="request_id")
    return view


def split_history(history: list[StreamEvent], last_event_id: str | None) -> tuple[list[StreamEvent], str]:
    """The events the client already has, and the entry id to follow from."""
    if not last_event_id:
        return [], "0"
    for position, item in enumerate(history):
        if item.entry_id == last_event_id:
            return history[: position + 1], last_event_id
    raise InvalidRequest(
        f"Last-Event-ID {last_event_id!r} is not an event of this stream.", param="Last-Event-ID"
    )


class Resumer:
    """Resumes streams this gateway never served; built per request from the gateway state."""

    def __init__(
        self, redis: Redis, dispatcher: Dispatcher, streams: StreamSlots, drain_grace_s: float
    ) -> None:
        self._redis = redis
        self._dispatcher = dispatcher
        self._streams = streams
        self._drain_grace_s = drain_grace_s

    async def resume(
        self, request_id: str, principal: Principal, last_event_id: str | None, stream_id: str
    ) -> EventSourceResponse:
        """The stream of ``request_id`` after ``last_event_id``, rendered as its first gateway did;
        it holds one of the caller's stream slots, named ``stream_id`` (this request's id)."""
        view = await load_view(self._redis, request_id, principal.tenant)

        async def stream(on_close: sse.OnClose) -> EventSourceResponse:
            return await self._stream(request_id, view, last_event_id, on_close)

        return await self._streams.open(principal, stream_id, stream)

    async def _stream(
        self, request_id: str, view: StreamView, last_event_id: str | None, on_close: sse.OnClose
    ) -> EventSourceResponse:
        history = await self._dispatcher.history(request_id, view.model)
        seen, follow_from = split_history(history, last_event_id)
        render = view.renderer()
        for item in seen:
            render(item.event)  # rebuild the chunk state the client's copy of the stream has
        if any(item.event.type in TERMINAL_EVENT_TYPES for item in seen):
            rest = _nothing()  # the client has the whole stream but [DONE]
        else:
            rest = self._dispatcher.follow(request_id, view.model, follow_from)
        return sse.event_stream(None, rest, render, drain_grace_s=self._drain_grace_s, on_close=on_close)


async def _nothing() -> AsyncGenerator[list[StreamEvent], None]:
    return
    yield  # an empty async generator


async def get_resumer(request: Request) -> Resumer:
    state = get_state(request)
    return Resumer(state.pool, state.dispatcher, state.streams, state.drain_grace_s)


ResumerDep = Annotated[Resumer, Depends(get_resumer)]
