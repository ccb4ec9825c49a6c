"""Owns POST /v1/chat/completions: translate, dispatch, answer as JSON or SSE."""

from __future__ import annotations

import time
from functools import partial

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse

from gateway import sse, translate
from gateway.deps import DispatcherDep, JsonBody, RequestIdDep
from gateway.openai_schema import ChatCompletion, ChatCompletionRequest

router = APIRouter(tags=["openai"])


@router.post("/v1/chat/completions", response_model=ChatCompletion, dependencies=[JsonBody])
async def create_chat_completion(
    body: ChatCompletionRequest, dispatcher: DispatcherDep, request_id: RequestIdDep, request: Request
) -> ChatCompletion | EventSourceResponse:
    """Generate the assistant's next message; streamed as chat.completion.chunk events if asked."""
    created_at = time.time()
    job = translate.chat_job(body, request_id, created_at)
    meta = translate.chat_meta(body, request_id, created_at)
    if not body.stream:
        return translate.chat_completion(meta, await dispatcher.complete(job, request.receive))
    admission = await dispatcher.start(job, request.receive)
    return sse.event_stream(
        admission.accepted, dispatcher.relay(admission), partial(translate.chat_chunks, meta)
    )
