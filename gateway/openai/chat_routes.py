"""Owns POST /v1/chat/completions: translate, dispatch, answer as JSON or SSE."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse

from gateway.access.quota import QuotaDep
from gateway.dispatch import resume
from gateway.http import sse
from gateway.http.deps import DispatcherDep, JsonBody, PrincipalDep, RequestIdDep, get_state
from gateway.openai import render, translate
from gateway.openai.schema import ChatCompletion, ChatCompletionRequest

router = APIRouter(tags=["openai"])


@router.post("/v1/chat/completions", response_model=ChatCompletion, dependencies=[JsonBody])
async def create_chat_completion(
    body: ChatCompletionRequest,
    dispatcher: DispatcherDep,
    request_id: RequestIdDep,
    quota: QuotaDep,
    principal: PrincipalDep,
    request: Request,
) -> ChatCompletion | EventSourceResponse:
    """Generate the assistant's next message; streamed as chat.completion.chunk events if asked."""
    created_at = time.time()
    translate.check_choice_count(body, get_state(request).max_choices)
    job = await quota.charge(translate.chat_job(body, request_id, created_at))
    meta = translate.chat_meta(body, request_id, created_at)
    if not body.stream:
        return render.chat_completion(meta, await dispatcher.complete(job, request.receive))
    state = get_state(request)
    await resume.save_view(state.pool, request_id, "chat", meta, principal.tenant)
    acceptance = await dispatcher.start(job, request.receive)
    return sse.event_stream(
        acceptance.accepted,
        dispatcher.relay(acceptance),
        render.ChatStream(meta).chunks,
        drain_grace_s=state.drain_grace_s,
    )
