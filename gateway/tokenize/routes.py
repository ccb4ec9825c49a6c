"""Owns POST /tokenize and POST /detokenize (vLLM's shapes): the worker's tokenizer, through Redis.

The gateway has no tokenizer (it stays model-agnostic and torch-free), so each
call is a short job on the model's queue that any worker of it answers on a reply
key (``shared/jobs/replies.py``). A model nobody serves is 404 at once, one with no
live worker 503, and a worker that does not answer in time 504.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.dispatch.dispatcher import require_live
from gateway.http.deps import JsonBody, PoolDep, RequestIdDep
from gateway.openai import translate
from gateway.openai.schema import ErrorBody
from gateway.tokenize.schema import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from shared.errors import error_from_info
from shared.jobs import jobqueue, replies
from shared.protocol import Failed, Tokenized, TokenizeJob

router = APIRouter(tags=["tokenizer"])

# Tokenizing is quick; a worker that has not answered by then is not going to.
REPLY_TIMEOUT_S = 30.0
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid input: the message and `param` name the problem."},
    504: {"model": ErrorBody, "description": "No worker answered in time."},
}


@router.post("/tokenize", response_model=TokenizeResponse, dependencies=[JsonBody], responses=_ERRORS)
async def tokenize(body: TokenizeRequest, pool: PoolDep, request_id: RequestIdDep) -> TokenizeResponse:
    """Token ids of a prompt, or of chat messages rendered with the model's template."""
    answer = await _ask_worker(pool, translate.tokenize_job(body, request_id))
    return TokenizeResponse(
        count=len(answer.tokens), max_model_len=answer.max_model_len, tokens=answer.tokens
    )


@router.post("/detokenize", response_model=DetokenizeResponse, dependencies=[JsonBody], responses=_ERRORS)
async def detokenize(body: DetokenizeRequest, pool: PoolDep, request_id: RequestIdDep) -> DetokenizeResponse:
    """The text of token ids (special tokens skipped)."""
    answer = await _ask_worker(pool, translate.detokenize_job(body, request_id))
    return DetokenizeResponse(prompt=answer.text)


async def _ask_worker(pool: PoolDep, job: TokenizeJob) -> Tokenized:
    await require_live(pool, job.model)
    await jobqueue.enqueue_tokenize(pool, job)
    reply = await replies.await_reply(pool, job.request_id, REPLY_TIMEOUT_S)
    if isinstance(reply, Failed):
        raise error_from_info(reply.error)
    return reply
