"""Owns GET /v1/models and /v1/models/{id}: the models live workers serve right now."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.http.deps import PoolDep
from gateway.http.errors import unknown_model
from gateway.openai import translate
from gateway.openai.schema import ModelCard, ModelList
from shared import registry

router = APIRouter(tags=["openai"])


@router.get("/v1/models", response_model=ModelList)
async def list_models(pool: PoolDep) -> ModelList:
    """Every model at least one live worker serves, once each."""
    return translate.model_list(await registry.live_workers(pool))


# `:path` because hub ids contain a slash (HuggingFaceTB/SmolLM2-135M-Instruct).
@router.get("/v1/models/{model_id:path}", response_model=ModelCard)
async def retrieve_model(model_id: str, pool: PoolDep) -> ModelCard:
    """One live model; 404 model_not_found when no live worker serves it."""
    models = translate.model_list(await registry.live_workers(pool))
    for card in models.data:
        if card.id == model_id:
            return card
    raise unknown_model(model_id)
