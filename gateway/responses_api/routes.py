"""Owns the Responses API's routes: create, retrieve, cancel (answered by ``responses_api/service.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from sse_starlette import EventSourceResponse

from gateway.access.ownership import owned
from gateway.http.deps import JsonBody
from gateway.responses_api.objects import Response
from gateway.responses_api.schema import ResponseCreateRequest
from gateway.responses_api.service import ResponsesDep
from shared.access.ownership import ResourceKind

router = APIRouter(tags=["responses"])
# Someone else's id answers 404 before the handler runs (gateway/access/ownership.py).
OWNED_RESPONSE = [Depends(owned(ResourceKind.RESPONSE, "response_id"))]


@router.post("/v1/responses", response_model=Response, dependencies=[JsonBody])
async def create_response(
    body: ResponseCreateRequest, responses: ResponsesDep
) -> Response | EventSourceResponse:
    """Generate a response; streamed as Responses API events if asked; ``background`` answers at once."""
    return await responses.create(body)


@router.get("/v1/responses/{response_id}", response_model=Response, dependencies=OWNED_RESPONSE)
async def retrieve_response(
    response_id: str,
    responses: ResponsesDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0)] = None,
) -> Response | EventSourceResponse:
    """A background response as it stands: queued, in_progress, or finished with its output.

    With ``stream``, its events instead, from the start or after the ``starting_after``-th
    (a stream picked up again): they are replayed from its job's events, so their numbers
    are those of the first stream.
    """
    return await responses.retrieve(response_id, stream=stream, starting_after=starting_after)


@router.post("/v1/responses/{response_id}/cancel", response_model=Response, dependencies=OWNED_RESPONSE)
async def cancel_response(response_id: str, responses: ResponsesDep) -> Response:
    """Cancel a background response that has not finished; a finished one is returned as it is."""
    return await responses.cancel(response_id)
