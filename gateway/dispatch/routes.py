"""Owns GET /v1/requests/{request_id}/stream: resuming a streamed response on any gateway."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from sse_starlette import EventSourceResponse

from gateway.dispatch.resume import ResumerDep
from gateway.http.deps import PrincipalDep, RequestIdDep

router = APIRouter(tags=["openai"])


@router.get(
    "/v1/requests/{request_id}/stream",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "The rest of the stream."}},
)
async def resume_stream(
    request_id: str,
    resumer: ResumerDep,
    principal: PrincipalDep,
    stream_id: RequestIdDep,
    last_event_id: Annotated[str | None, Header(description="The id of the last SSE event received.")] = None,
    after: Annotated[str | None, Query(description="Same as the Last-Event-ID header.")] = None,
) -> EventSourceResponse:
    """Go on with a streamed completion after the event the client last received.

    The request id is the ``x-request-id`` header of the original response. Events
    after ``Last-Event-ID`` are sent exactly as the original gateway would have.
    """
    return await resumer.resume(request_id, principal, last_event_id or after, stream_id)
