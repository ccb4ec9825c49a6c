"""Owns tokenizing through a worker: a short job on the model's queue, answered on a reply key.

The gateway has no tokenizer (it stays model-agnostic and torch-free), so each
call is a ``TokenizeJob`` that any worker of the model answers on a reply key
(``shared/jobs/replies.py``). A model nobody serves is 404 at once, one with no
live worker 503, and a worker that does not answer in time 504.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.dispatch.dispatcher import require_live
from gateway.http.deps import GatewayState, get_state
from gateway.openai import translate
from gateway.tokenize.schema import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from shared.errors import error_from_info
from shared.jobs import jobqueue, replies
from shared.protocol import Failed, Tokenized, TokenizeJob

# Tokenizing is quick; a worker that has not answered by then is not going to.
REPLY_TIMEOUT_S = 30.0


class WorkerTokenizer:
    """Tokenizes and detokenizes with a model's workers; built per request from the gateway state."""

    def __init__(self, state: GatewayState, reply_timeout_s: float = REPLY_TIMEOUT_S) -> None:
        self._groups = state.groups
        self._reply_timeout_s = reply_timeout_s

    async def tokenize(self, body: TokenizeRequest, request_id: str) -> TokenizeResponse:
        """Token ids of a prompt, or of chat messages rendered with the model's template."""
        answer = await self._ask(translate.tokenize_job(body, request_id))
        return TokenizeResponse(
            count=len(answer.tokens), max_model_len=answer.max_model_len, tokens=answer.tokens
        )

    async def detokenize(self, body: DetokenizeRequest, request_id: str) -> DetokenizeResponse:
        """The text of token ids (special tokens skipped)."""
        answer = await self._ask(translate.detokenize_job(body, request_id))
        return DetokenizeResponse(prompt=answer.text)

    async def _ask(self, job: TokenizeJob) -> Tokenized:
        job = job.model_copy(update={"model": await require_live(self._groups, job.model)})
        pool = self._groups.for_model(job.model)  # the worker answers in its group's Redis
        await jobqueue.enqueue_tokenize(pool, job)
        reply = await replies.await_reply(pool, job.request_id, self._reply_timeout_s)
        if isinstance(reply, Failed):
            raise error_from_info(reply.error)
        return reply


async def get_tokenizer(request: Request) -> WorkerTokenizer:
    return WorkerTokenizer(get_state(request))


TokenizerDep = Annotated[WorkerTokenizer, Depends(get_tokenizer)]
