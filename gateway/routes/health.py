"""Owns GET /health: liveness of this process, answered without auth or Redis."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    status: Literal["ok"] = "ok"


@router.get("/health", response_model=Health)
async def health() -> Health:
    """Always 200 while the process serves HTTP; readiness is a separate question."""
    return Health()
