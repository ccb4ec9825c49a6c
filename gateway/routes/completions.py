"""Owns POST /v1/completions: translate, dispatch, answer as JSON or SSE."""

from __future__ import annotations

import time
from functools import partial

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse

from gateway import sse, translate
from gateway.deps import DispatcherDep, JsonBody, RequestIdDep
from gateway.openai_schema import Completion, CompletionRequest

router = APIRouter(tags=["openai"])


@router.post("/v1/completions", response_model=Completion, dependencies=[JsonBody])
async def create_completion(
    body: CompletionRequest, dispatcher: DispatcherDep, request_id: RequestIdDep, request: Request
) -> Completion | EventSourceResponse:
    """Continue a raw prompt (no chat template); streamed as text_completion chunks if asked."""
    created_at = time.time()
    job = translate.completion_job(body, request_id, created_at)
    meta = translate.completion_meta(body, request_id, created_at)
    if not body.stream:
        return translate.text_completion(meta, await dispatcher.complete(job, request.receive))
    admission = await dispatcher.start(job, request.receive)
    return sse.event_stream(
        admission.accepted, dispatcher.relay(admission), partial(translate.completion_chunks, meta)
    )
