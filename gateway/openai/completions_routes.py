"""Owns POST /v1/completions: translate, dispatch (one job per prompt), answer as JSON or SSE."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse

from gateway.access.quota import QuotaDep
from gateway.dispatch import fanout, resume
from gateway.dispatch.dispatcher import unless_disconnected
from gateway.http import sse
from gateway.http.deps import DispatcherDep, JsonBody, PrincipalDep, RequestIdDep, get_state
from gateway.openai import render, translate
from gateway.openai.schema import Completion, CompletionRequest

router = APIRouter(tags=["openai"])


@router.post("/v1/completions", response_model=Completion, dependencies=[JsonBody])
async def create_completion(
    body: CompletionRequest,
    dispatcher: DispatcherDep,
    request_id: RequestIdDep,
    quota: QuotaDep,
    principal: PrincipalDep,
    request: Request,
) -> Completion | EventSourceResponse:
    """Continue a raw prompt (no chat template); streamed as text_completion chunks if asked."""
    created_at = time.time()
    translate.check_choice_count(body, get_state(request).max_choices)
    jobs = await quota.charge_all(translate.completion_jobs(body, request_id, created_at))
    meta = translate.completion_meta(body, request_id, created_at)
    if not body.stream:
        results = await unless_disconnected(fanout.collect_all(dispatcher, jobs), request.receive)
        return render.text_completion(meta, results)
    state = get_state(request)
    if len(jobs) == 1:  # a stream merged from several prompts' streams cannot be resumed by one id
        await resume.save_view(state.pool, request_id, "completion", meta, principal.tenant)
    acceptances = await unless_disconnected(fanout.submit_all(dispatcher, jobs), request.receive)
    return sse.event_stream(
        acceptances[0].accepted,
        fanout.relay_all(dispatcher, acceptances, meta.n),
        render.CompletionStream(meta).chunks,
        drain_grace_s=state.drain_grace_s,
    )
