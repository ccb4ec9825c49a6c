"""Owns GET /v1/requests/{request_id}/stream: resuming a streamed response on any gateway."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from sse_starlette import EventSourceResponse

from gateway.dispatch import resume
from gateway.http import sse
from gateway.http.deps import DispatcherDep, PoolDep, PrincipalDep, get_state
from shared.jobs.streams import StreamEvent
from shared.protocol import TERMINAL_EVENT_TYPES

router = APIRouter(tags=["openai"])


@router.get(
    "/v1/requests/{request_id}/stream",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "The rest of the stream."}},
)
async def resume_stream(
    request_id: str,
    request: Request,
    dispatcher: DispatcherDep,
    pool: PoolDep,
    principal: PrincipalDep,
    last_event_id: Annotated[str | None, Header(description="The id of the last SSE event received.")] = None,
    after: Annotated[str | None, Query(description="Same as the Last-Event-ID header.")] = None,
) -> EventSourceResponse:
    """Go on with a streamed completion after the event the client last received.

    The request id is the ``x-request-id`` header of the original response. Events
    after ``Last-Event-ID`` are sent exactly as the original gateway would have.
    """
    view = await resume.load_view(pool, request_id, principal.tenant)
    seen, follow_from = resume.split_history(await dispatcher.history(request_id), last_event_id or after)
    render = view.renderer()
    for item in seen:
        render(item.event)  # rebuild the chunk state the client's copy of the stream has
    if any(item.event.type in TERMINAL_EVENT_TYPES for item in seen):
        rest = _nothing()  # the client has the whole stream but [DONE]
    else:
        rest = dispatcher.follow(request_id, follow_from)
    return sse.event_stream(None, rest, render, drain_grace_s=get_state(request).drain_grace_s)


async def _nothing() -> AsyncGenerator[StreamEvent, None]:
    return
    yield  # an empty async generator
