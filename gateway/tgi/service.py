"""Owns answering TGI's native requests: the model they mean, the quota charge, submitting, the answer.

TGI serves one model and its requests name none: the model is the body's ``model``
(our extension) or else the only one live workers serve (``resolve_model``).
Otherwise a TGI request runs like any other: translated into one job, charged to
the caller's quota, submitted through the dispatcher, and answered as one
``GenerateResponse`` or as TGI's token stream (``gateway/tgi/sse.py``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sse_starlette import EventSourceResponse
from starlette.types import Receive

from gateway.access.quota import Quota, QuotaDep
from gateway.http.deps import GatewayState, RequestIdDep, get_state
from gateway.http.errors import unknown_model
from gateway.http.sse import OnClose
from gateway.tgi import translate
from gateway.tgi.schema import GenerateRequest, GenerateResponse, Info
from gateway.tgi.sse import token_stream
from shared import __version__, registry
from shared.errors import InvalidRequest, NoLiveWorker
from shared.protocol import GenerationJob
from shared.registry import WorkerInfo


@dataclass(frozen=True, slots=True)
class TgiService:
    """One TGI request's answer, with what it needs of the gateway and of its caller."""

    state: GatewayState
    quota: Quota
    request_id: str
    receive: Receive

    async def generate(self, body: GenerateRequest) -> GenerateResponse:
        """The generated text; with ``details`` also its tokens, finish reason and seed."""
        job = await self._charged_job(body, stream=False)
        return translate.generate_response(body, await self.state.dispatcher.complete(job, self.receive))

    async def generate_stream(self, body: GenerateRequest) -> EventSourceResponse:
        """One event per token; the last carries generated_text (and details if asked)."""
        job = await self._charged_job(body, stream=True)

        async def stream(on_close: OnClose) -> EventSourceResponse:
            acceptance = await self.state.dispatcher.start(job, self.receive)
            relayed = self.state.dispatcher.relay(acceptance)
            return token_stream(acceptance.accepted, relayed, translate.TgiStream(body), on_close)

        return await self.state.streams.open(self.quota.principal, self.request_id, stream)

    async def info(self, model: str | None) -> Info:
        """The served model and its limits, as TGI describes itself."""
        workers = await self.state.groups.live_workers()
        name = resolve_model(model, workers)
        found = registry.serving(name, workers)
        if found is None:
            raise unknown_model(name, registry.served_names(workers))
        serving = [worker for worker in workers if worker.model == found.model]
        return translate.info(name, serving, __version__)

    async def _charged_job(self, body: GenerateRequest, *, stream: bool) -> GenerationJob:
        model = resolve_model(body.model, await self.state.groups.live_workers())
        # On a thread: checking a large grammar would stall every stream of this gateway.
        job = await asyncio.to_thread(
            functools.partial(translate.generate_job, stream=stream),
            body,
            model,
            self.request_id,
            time.time(),
        )
        return await self.quota.charge(job)


def resolve_model(requested: str | None, workers: list[WorkerInfo]) -> str:
    """The model a TGI request means: the one it names (the dispatcher checks it), else the only one."""
    if requested is not None:
        return requested
    served = sorted({worker.model for worker in workers})  # models, not their aliases
    if not served:
        raise NoLiveWorker("No worker is serving a model right now; retry shortly.")
    if len(served) > 1:
        raise InvalidRequest(
            f"This server serves several models ({', '.join(served)}); name one with `model`.", param="model"
        )
    return served[0]


async def get_tgi(request: Request, quota: QuotaDep, request_id: RequestIdDep) -> TgiService:
    return TgiService(get_state(request), quota, request_id, request.receive)


TgiDep = Annotated[TgiService, Depends(get_tgi)]
