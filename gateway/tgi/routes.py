"""Owns HuggingFace TGI's native routes: POST /generate, /generate_stream and /, GET /info.

POST / is TGI's compatibility route (``huggingface_hub.InferenceClient`` posts
there when given a base URL): it answers like /generate, wrapped in a list, or
like /generate_stream when the body says ``stream: true``. TGI serves one model
and its requests name none: the model is the body's ``model`` (our extension) or
else the only one live workers serve.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Query, Request
from sse_starlette import EventSourceResponse

from gateway.access.quota import Quota, QuotaDep
from gateway.dispatch.dispatcher import Dispatcher
from gateway.http.deps import DispatcherDep, JsonBody, PoolDep, RequestIdDep
from gateway.http.errors import unknown_model
from gateway.http.openapi import TGI_COMPAT, TGI_GENERATION, TGI_READ, TGI_STREAM
from gateway.tgi import translate
from gateway.tgi.errors import TgiRoute
from gateway.tgi.schema import CompatGenerateRequest, GenerateRequest, GenerateResponse, Info
from gateway.tgi.sse import token_stream
from shared import __version__, registry
from shared.errors import InvalidRequest, NoLiveWorker
from shared.registry import WorkerInfo

router = APIRouter(tags=["tgi"], route_class=TgiRoute)


@router.post("/generate", response_model=GenerateResponse, responses=TGI_GENERATION, dependencies=[JsonBody])
async def generate(
    body: GenerateRequest,
    pool: PoolDep,
    dispatcher: DispatcherDep,
    request_id: RequestIdDep,
    quota: QuotaDep,
    request: Request,
) -> GenerateResponse:
    """Generate text for ``inputs``; with ``details`` also its tokens, finish reason and seed."""
    model = resolve_model(body.model, await registry.live_workers(pool))
    job = await quota.charge(translate.generate_job(body, model, request_id, time.time(), stream=False))
    return translate.generate_response(body, await dispatcher.complete(job, request.receive))


@router.post(
    "/generate_stream",
    response_class=EventSourceResponse,
    responses={**TGI_GENERATION, **TGI_STREAM},
    dependencies=[JsonBody],
)
async def generate_stream(
    body: GenerateRequest,
    pool: PoolDep,
    dispatcher: DispatcherDep,
    request_id: RequestIdDep,
    quota: QuotaDep,
    request: Request,
) -> EventSourceResponse:
    """Stream one event per token; the last carries generated_text (and details if asked)."""
    model = resolve_model(body.model, await registry.live_workers(pool))
    return await _stream(body, model, dispatcher, request_id, quota, request)


@router.post("/", response_model=list[GenerateResponse], responses=TGI_COMPAT, dependencies=[JsonBody])
async def compat_generate(
    body: CompatGenerateRequest,
    pool: PoolDep,
    dispatcher: DispatcherDep,
    request_id: RequestIdDep,
    quota: QuotaDep,
    request: Request,
) -> list[GenerateResponse] | EventSourceResponse:
    """/generate (answer wrapped in a list) or /generate_stream, as ``stream`` says."""
    model = resolve_model(body.model, await registry.live_workers(pool))
    if body.stream:
        return await _stream(body, model, dispatcher, request_id, quota, request)
    job = await quota.charge(translate.generate_job(body, model, request_id, time.time(), stream=False))
    return [translate.generate_response(body, await dispatcher.complete(job, request.receive))]


@router.get("/info", response_model=Info, responses=TGI_READ)
async def info(
    pool: PoolDep, model: str | None = Query(None, description="Needed only when several models are served.")
) -> Info:
    """The served model and its limits, as TGI describes itself."""
    workers = await registry.live_workers(pool)
    name = resolve_model(model, workers)
    serving = [worker for worker in workers if worker.model == name]
    if not serving:
        raise unknown_model(name)
    return translate.info(name, serving, __version__)


async def _stream(
    body: GenerateRequest,
    model: str,
    dispatcher: Dispatcher,
    request_id: str,
    quota: Quota,
    request: Request,
) -> EventSourceResponse:
    job = await quota.charge(translate.generate_job(body, model, request_id, time.time(), stream=True))
    acceptance = await dispatcher.start(job, request.receive)
    return token_stream(acceptance.accepted, dispatcher.relay(acceptance), translate.TgiStream(body))


def resolve_model(requested: str | None, workers: list[WorkerInfo]) -> str:
    """The model a TGI request means: the one it names (the dispatcher checks it), else the only one."""
    if requested is not None:
        return requested
    served = sorted({worker.model for worker in workers})
    if not served:
        raise NoLiveWorker("No worker is serving a model right now; retry shortly.")
    if len(served) > 1:
        raise InvalidRequest(
            f"This server serves several models ({', '.join(served)}); name one with `model`.", param="model"
        )
    return served[0]
