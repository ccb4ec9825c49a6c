"""Owns the Responses API: create (JSON, SSE, or ``background``), retrieve, cancel.

Foreground responses run through the Dispatcher like chat completions; a
``background`` one is enqueued, stored as ``queued`` and answered at once, and a
runner completes it (``gateway/responses_api/store.py``); clients poll it by id. A
background one asked with ``stream`` is also streamed as it runs; leaving that
stream does not stop it.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from sse_starlette import EventSourceResponse

from gateway.access.ownership import owned
from gateway.access.quota import QuotaDep
from gateway.background.work import BackgroundDep
from gateway.dispatch.dispatcher import require_live
from gateway.http import sse
from gateway.http.deps import DispatcherDep, JsonBody, PoolDep, PrincipalDep, RequestIdDep, get_state
from gateway.responses_api import translate
from gateway.responses_api.schema import TERMINAL_RESPONSE_STATUSES, Response, ResponseCreateRequest
from shared import keys
from shared.access.ownership import ResourceKind
from shared.errors import InvalidRequest, NotFound
from shared.jobs import jobqueue

router = APIRouter(tags=["responses"])
# Someone else's id answers 404 before the handler runs (gateway/access/ownership.py).
OWNED_RESPONSE = [Depends(owned(ResourceKind.RESPONSE, "response_id"))]


@router.post("/v1/responses", response_model=Response, dependencies=[JsonBody])
async def create_response(
    body: ResponseCreateRequest,
    dispatcher: DispatcherDep,
    request_id: RequestIdDep,
    quota: QuotaDep,
    principal: PrincipalDep,
    background: BackgroundDep,
    pool: PoolDep,
    request: Request,
) -> Response | EventSourceResponse:
    """Generate a response; streamed as Responses API events if asked; ``background`` answers at once."""
    created_at = time.time()
    job = await quota.charge(translate.response_job(body, request_id, created_at))
    pending = translate.pending_response(body, request_id, created_at)
    drain_grace_s = get_state(request).drain_grace_s
    if body.background:
        await require_live(pool, body.model)
        await background.responses.create(principal.tenant, pending, request_id)
        await jobqueue.enqueue(pool, job)
        if not body.stream:
            return pending
        # Streamed as it runs; a client leaving does not cancel it (cancel does), and it can be polled.
        stream = translate.ResponseStream(pending, request_id, time.time())
        return sse.event_stream(
            None, dispatcher.watch(request_id), stream.events, drain_grace_s=drain_grace_s
        )
    if not body.stream:
        events = await dispatcher.complete(job, request.receive)
        return translate.finished_response(pending, events, request_id, time.time())
    acceptance = await dispatcher.start(job, request.receive)
    stream = translate.ResponseStream(pending, request_id, time.time())
    return sse.event_stream(
        acceptance.accepted,
        dispatcher.relay(acceptance),
        stream.events,
        drain_grace_s=drain_grace_s,
    )


@router.get("/v1/responses/{response_id}", response_model=Response, dependencies=OWNED_RESPONSE)
async def retrieve_response(
    response_id: str,
    background: BackgroundDep,
    dispatcher: DispatcherDep,
    pool: PoolDep,
    request: Request,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0)] = None,
) -> Response | EventSourceResponse:
    """A background response as it stands: queued, in_progress, or finished with its output.

    With ``stream``, its events instead, from the start or after the ``starting_after``-th
    (a stream picked up again): they are replayed from its job's events, so their numbers
    are those of the first stream.
    """
    response = await background.responses.get(response_id)
    if response is None:
        raise _missing(response_id)
    if not stream:
        return response
    request_id = await background.responses.request_id(response_id)
    if request_id is None:
        raise _missing(response_id)
    if response.status in TERMINAL_RESPONSE_STATUSES and not await pool.exists(keys.events(request_id)):
        raise InvalidRequest(
            "This response's events are no longer kept; retrieve it without `stream`.", param="stream"
        )
    after = -1 if starting_after is None else starting_after
    replay = translate.ResponseStream(translate.as_created(response), request_id, time.time(), after)
    watched = dispatcher.watch(request_id)
    return sse.event_stream(None, watched, replay.events, drain_grace_s=get_state(request).drain_grace_s)


@router.post("/v1/responses/{response_id}/cancel", response_model=Response, dependencies=OWNED_RESPONSE)
async def cancel_response(response_id: str, background: BackgroundDep, pool: PoolDep) -> Response:
    """Cancel a background response that has not finished; a finished one is returned as it is."""
    request_id = await background.responses.request_id(response_id)
    response = await background.responses.cancel(response_id)
    if response is None or request_id is None:
        raise _missing(response_id)
    if response.status == "cancelled":
        await jobqueue.abort(pool, request_id)
    return response


def _missing(response_id: str) -> NotFound:
    return NotFound(f"No response found with id '{response_id}'.", param="response_id")
