"""Owns answering OpenAI's chat, completions and models requests: charge, submit, render as JSON or SSE.

Routes (``gateway/openai/routes.py``) hand their validated body to ``OpenAIService``,
bound to one request: it translates the body into jobs, charges the caller's quota,
submits the jobs through the dispatcher and renders their events as one object or,
streamed, as chunks. A streamed answer that one job makes can be resumed on any
gateway, so its view is stored before it starts (``gateway/dispatch/resume.py``).
``ModelCatalog`` lists the models live workers serve.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sse_starlette import EventSourceResponse
from starlette.types import Receive

from gateway.access.quota import Quota, QuotaDep
from gateway.dispatch import fanout, resume
from gateway.dispatch.dispatcher import unless_disconnected
from gateway.http import sse
from gateway.http.deps import GatewayState, PrincipalDep, RequestIdDep, get_state
from gateway.http.errors import unknown_model
from gateway.openai import objects, render, schema, translate
from shared.jobs.streams import StreamEvent
from shared.protocol import GenerationJob


@dataclass(frozen=True, slots=True)
class OpenAIService:
    """One request's answer, with what it needs of the gateway and of its caller."""

    state: GatewayState
    quota: Quota
    request_id: str
    tenant: str
    receive: Receive

    async def chat(self, body: schema.ChatCompletionRequest) -> objects.ChatCompletion | EventSourceResponse:
        """The assistant's next message; streamed as chat.completion.chunk events if asked."""
        created_at = time.time()
        [job] = await self._jobs(body, created_at)
        job = await self.quota.charge(job)
        meta = translate.chat_meta(body, self.request_id, created_at)
        if body.stream:
            return await self._chat_stream(job, meta)
        return render.chat_completion(meta, await self.state.dispatcher.complete(job, self.receive))

    async def complete(self, body: schema.CompletionRequest) -> objects.Completion | EventSourceResponse:
        """Each prompt continued (one job per prompt); streamed as text_completion chunks if asked."""
        created_at = time.time()
        jobs = await self._jobs(body, created_at)
        jobs = await self.quota.charge_all(jobs)
        meta = translate.completion_meta(body, self.request_id, created_at)
        if body.stream:
            return await self._completion_stream(jobs, meta)
        results = await unless_disconnected(fanout.collect_all(self.state.dispatcher, jobs), self.receive)
        return render.text_completion(meta, results)

    async def _jobs(
        self, body: schema.ChatCompletionRequest | schema.CompletionRequest, created_at: float
    ) -> list[GenerationJob]:
        """``body``'s jobs; translated on a thread when it carries a schema or grammar to check, which
        would stall every stream of this gateway. Without one, the thread's two hand-offs cost more
        than the translation (0.7 ms of the request's path under strace; gateway CPU per request at
        c=1, fake engine, 6.30 -> 5.23 ms with the worker's preparation also on its loop)."""
        if translate.compiles_grammars(body):
            return await asyncio.to_thread(
                translate.request_jobs, body, self.request_id, created_at, self.state.max_choices
            )
        return translate.request_jobs(body, self.request_id, created_at, self.state.max_choices)

    async def _chat_stream(self, job: GenerationJob, meta: render.ResponseMeta) -> EventSourceResponse:
        async def stream(on_close: sse.OnClose) -> EventSourceResponse:
            await resume.save_view(self.state.pool, self.request_id, "chat", meta, self.tenant)
            acceptance = await self.state.dispatcher.start(job, self.receive)
            relayed = self.state.dispatcher.relay_batches(acceptance)
            return self._stream(acceptance.accepted, relayed, render.ChatStream(meta).chunks, on_close)

        return await self.state.streams.open(self.quota.principal, self.request_id, stream)

    async def _completion_stream(
        self, jobs: list[GenerationJob], meta: render.ResponseMeta
    ) -> EventSourceResponse:
        async def stream(on_close: sse.OnClose) -> EventSourceResponse:
            if len(jobs) == 1:  # a stream merged from several prompts' streams cannot be resumed by one id
                await resume.save_view(self.state.pool, self.request_id, "completion", meta, self.tenant)
            submitted = fanout.submit_all(self.state.dispatcher, jobs)
            acceptances = await unless_disconnected(submitted, self.receive)
            relayed = fanout.relay_all(self.state.dispatcher, acceptances, meta.n)
            chunks = render.CompletionStream(meta).chunks
            return self._stream(acceptances[0].accepted, relayed, chunks, on_close)

        return await self.state.streams.open(self.quota.principal, self.request_id, stream)

    def _stream(
        self,
        first: StreamEvent,
        rest: AsyncGenerator[sse.Relayed, None],
        to_chunks: sse.ChunkMaker,
        on_close: sse.OnClose,
    ) -> EventSourceResponse:
        grace_s = self.state.drain_grace_s
        return sse.event_stream(first, rest, to_chunks, drain_grace_s=grace_s, on_close=on_close)


@dataclass(frozen=True, slots=True)
class ModelCatalog:
    """The models live workers serve right now, as OpenAI lists them."""

    state: GatewayState

    async def models(self) -> objects.ModelList:
        """Every model at least one live worker serves, once each."""
        return translate.model_list(await self.state.groups.live_workers())

    async def model(self, model_id: str) -> objects.ModelCard:
        """One live model; 404 model_not_found when no live worker serves it."""
        cards = (await self.models()).data
        for card in cards:
            if card.id == model_id:
                return card
        raise unknown_model(model_id, [card.id for card in cards])  # every served name


async def get_openai(
    request: Request, quota: QuotaDep, request_id: RequestIdDep, principal: PrincipalDep
) -> OpenAIService:
    return OpenAIService(get_state(request), quota, request_id, principal.tenant, request.receive)


async def get_model_catalog(request: Request) -> ModelCatalog:
    return ModelCatalog(get_state(request))


OpenAIDep = Annotated[OpenAIService, Depends(get_openai)]
ModelCatalogDep = Annotated[ModelCatalog, Depends(get_model_catalog)]
