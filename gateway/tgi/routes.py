"""Owns HuggingFace TGI's native routes: POST /generate, /generate_stream and /, GET /info.

POST / is TGI's compatibility route (``huggingface_hub.InferenceClient`` posts
there when given a base URL): it answers like /generate, wrapped in a list, or
like /generate_stream when the body says ``stream: true``. The work is
``gateway/tgi/service.py``'s; failures answer in TGI's shape (``TgiRoute``).
"""

from __future__ import annotations

from fastapi import APIRouter, Query
from sse_starlette import EventSourceResponse

from gateway.http.deps import JsonBody
from gateway.http.openapi import TGI_COMPAT, TGI_GENERATION, TGI_READ, TGI_STREAM
from gateway.tgi.errors import TgiRoute
from gateway.tgi.schema import CompatGenerateRequest, GenerateRequest, GenerateResponse, Info
from gateway.tgi.service import TgiDep

router = APIRouter(tags=["tgi"], route_class=TgiRoute)


@router.post("/generate", response_model=GenerateResponse, responses=TGI_GENERATION, dependencies=[JsonBody])
async def generate(body: GenerateRequest, tgi: TgiDep) -> GenerateResponse:
    """Generate text for ``inputs``; with ``details`` also its tokens, finish reason and seed."""
    return await tgi.generate(body)


@router.post(
    "/generate_stream",
    response_class=EventSourceResponse,
    responses={**TGI_GENERATION, **TGI_STREAM},
    dependencies=[JsonBody],
)
async def generate_stream(body: GenerateRequest, tgi: TgiDep) -> EventSourceResponse:
    """Stream one event per token; the last carries generated_text (and details if asked)."""
    return await tgi.generate_stream(body)


@router.post("/", response_model=list[GenerateResponse], responses=TGI_COMPAT, dependencies=[JsonBody])
async def compat_generate(
    body: CompatGenerateRequest, tgi: TgiDep
) -> list[GenerateResponse] | EventSourceResponse:
    """/generate (answer wrapped in a list) or /generate_stream, as ``stream`` says."""
    if body.stream:
        return await tgi.generate_stream(body)
    return [await tgi.generate(body)]


@router.get("/info", response_model=Info, responses=TGI_READ)
async def info(
    tgi: TgiDep, model: str | None = Query(None, description="Needed only when several models are served.")
) -> Info:
    """The served model and its limits, as TGI describes itself."""
    return await tgi.info(model)
