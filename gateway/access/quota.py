"""Owns a generation job's quota charge at the HTTP edge: the max_tokens cap, its token charge, its owner.

Every route that submits a job passes it through ``Quota.charge`` after
translating the request and before submitting it:

1. ``max_tokens`` above the operator's ``max_tokens_limit`` is a 400 on
   ``max_tokens``; a request that names none gets the limit, so no request
   generates more than the operator allows.
2. The caller's tokens-per-minute bucket is charged an estimate: the prompt's
   tokens plus ``max_tokens`` for each of its ``n`` choices (OpenAI's rule); the
   jobs of a multi-prompt request are charged together, all or none. The gateway
   has no tokenizer (the worker owns it), so text counts one token per 4
   characters, and chat adds a few per message for the template. A request with
   no ``max_tokens`` (and no ``max_tokens_limit``) is charged its prompt only.
   Intentional divergence: the charge is not
   reconciled with the actual usage of the ``finished`` event. Like OpenAI, we
   count the worst case when charging, which never lets a key overshoot its limit
   while a long generation runs; refunding afterwards would need the charge to
   follow the stream through failover and disconnects for little gain.
3. The request's id is recorded as owned by the caller's tenant, so whatever
   serves that request's events later (stream resume) answers 404 to anyone else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from redis.asyncio import Redis

from gateway.access import ownership
from gateway.access.auth import Principal
from gateway.access.rate_limits import RateLimits
from gateway.http.deps import PrincipalDep, get_state
from shared import keys
from shared.access.ownership import ResourceKind
from shared.errors import InvalidRequest
from shared.protocol import ChatMessage, ChatPrompt, GenerationJob, TextPrompt, TokenPrompt

CHARS_PER_TOKEN = 4
# Role markers and separators a chat template adds around each message.
TEMPLATE_TOKENS_PER_MESSAGE = 4
# A request id owns its stream as long as the stream may exist (see shared/keys.py).
REQUEST_OWNER_TTL_S = keys.EVENTS_RUNNING_TTL_S + keys.EVENTS_TTL_S


@dataclass(frozen=True, slots=True)
class Quota:
    """The gateway's quota charge bound to one request's caller."""

    redis: Redis
    rate_limits: RateLimits
    max_tokens_limit: int | None
    principal: Principal
    scope_state: dict[str, Any]

    async def charge(self, job: GenerationJob) -> GenerationJob:
        """The job as it may run (capped); 400 over the cap, 429 over the token limit."""
        return (await self.charge_all([job]))[0]

    async def charge_all(self, jobs: Sequence[GenerationJob]) -> list[GenerationJob]:
        """The jobs of one request (one per prompt), charged together: all or none."""
        capped_jobs = [capped(job, self.max_tokens_limit) for job in jobs]
        tokens = sum(estimated_tokens(job) for job in capped_jobs)
        await self.rate_limits.charge_tokens(self.principal, self.scope_state, tokens)
        for job in capped_jobs:
            await ownership.claim(
                self.redis, self.principal, ResourceKind.REQUEST, job.request_id, REQUEST_OWNER_TTL_S
            )
        return capped_jobs


def capped(job: GenerationJob, max_tokens_limit: int | None) -> GenerationJob:
    """``job`` with ``max_tokens`` filled to the limit when missing; 400 when it asks more."""
    if max_tokens_limit is None:
        return job
    asked = job.sampling.max_tokens
    if asked is None:
        sampling = job.sampling.model_copy(update={"max_tokens": max_tokens_limit})
        return job.model_copy(update={"sampling": sampling})
    if asked > max_tokens_limit:
        raise InvalidRequest(
            f"max_tokens is too large: {asked}. This server allows at most {max_tokens_limit}.",
            param="max_tokens",
        )
    return job


def estimated_tokens(job: GenerationJob) -> int:
    """The worst case of ``job``: its estimated prompt plus ``max_tokens`` per choice (0 when open-ended)."""
    return estimated_prompt_tokens(job) + (job.sampling.max_tokens or 0) * job.n


def estimated_prompt_tokens(job: GenerationJob) -> int:
    prompt = job.prompt
    if isinstance(prompt, TokenPrompt):
        return len(prompt.token_ids)
    if isinstance(prompt, TextPrompt):
        return _text_tokens(prompt.text)
    assert isinstance(prompt, ChatPrompt)
    messages = sum(_message_tokens(message) for message in prompt.messages)
    # The template renders every tool's schema into the prompt too.
    tools = sum(_text_tokens(tool.model_dump_json()) for tool in prompt.tools or [])
    return messages + tools


def _message_tokens(message: ChatMessage) -> int:
    calls = sum(_text_tokens(call.name + call.arguments) for call in message.tool_calls or [])
    return _text_tokens(message.content or "") + calls + TEMPLATE_TOKENS_PER_MESSAGE


def _text_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


async def get_quota(request: Request, principal: PrincipalDep) -> Quota:
    state = get_state(request)
    scope_state = request.scope.setdefault("state", {})
    return Quota(state.pool, state.rate_limits, state.max_tokens_limit, principal, scope_state)


QuotaDep = Annotated[Quota, Depends(get_quota)]
