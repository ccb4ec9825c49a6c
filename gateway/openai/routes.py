"""Owns OpenAI's routes: POST /v1/chat/completions and /v1/completions, GET /v1/models and /v1/models/{id}.

Each handler hands its validated body to ``gateway/openai/service.py``. Two
routers, because the app declares different error responses for each:
``router`` generates (and may stream), ``models_router`` only reads.
"""

from __future__ import annotations

from fastapi import APIRouter
from sse_starlette import EventSourceResponse

from gateway.http.deps import JsonBody
from gateway.openai.objects import ChatCompletion, Completion, ModelCard, ModelList
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from gateway.openai.service import ModelCatalogDep, OpenAIDep

router = APIRouter(tags=["openai"])
models_router = APIRouter(tags=["openai"])


@router.post("/v1/chat/completions", response_model=ChatCompletion, dependencies=[JsonBody])
async def create_chat_completion(
    body: ChatCompletionRequest, openai: OpenAIDep
) -> ChatCompletion | EventSourceResponse:
    """Generate the assistant's next message; streamed as chat.completion.chunk events if asked."""
    return await openai.chat(body)


@router.post("/v1/completions", response_model=Completion, dependencies=[JsonBody])
async def create_completion(body: CompletionRequest, openai: OpenAIDep) -> Completion | EventSourceResponse:
    """Continue a raw prompt (no chat template); streamed as text_completion chunks if asked."""
    return await openai.complete(body)


@models_router.get("/v1/models", response_model=ModelList)
async def list_models(catalog: ModelCatalogDep) -> ModelList:
    """Every model at least one live worker serves, once each."""
    return await catalog.models()


# `:path` because hub ids contain a slash (HuggingFaceTB/SmolLM2-135M-Instruct).
@models_router.get("/v1/models/{model_id:path}", response_model=ModelCard)
async def retrieve_model(model_id: str, catalog: ModelCatalogDep) -> ModelCard:
    """One live model; 404 model_not_found when no live worker serves it."""
    return await catalog.model(model_id)
