"""Owns the operational probes: GET /health (liveness), /ready (readiness) and /version.

None of them needs an API key: load balancers and orchestrators call them without one.
/health answers from this process alone. /ready asks Redis, under a short deadline
(``gateway/ops/probes.py``).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from gateway.openai.schema import ErrorBody
from gateway.ops.probes import ProbesDep
from shared import __version__
from shared.protocol import PROTOCOL_VERSION

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"
    redis: Literal["ok"] = "ok"
    live_workers: int = Field(description="Workers whose heartbeat is current.")
    models: list[str] = Field(description="Models those workers serve, once each.")


class Version(BaseModel):
    version: str = Field(description="tokenferry's version.")
    protocol_version: int = Field(description="Version of the gateway-worker job and event protocol.")


@router.get("/health", response_model=Health)
async def health() -> Health:
    """Always 200 while the process serves HTTP; readiness is a separate question."""
    return Health()


@router.get(
    "/ready",
    response_model=Readiness,
    responses={503: {"model": ErrorBody, "description": "Redis is unreachable or no worker is live."}},
)
async def ready(probes: ProbesDep) -> Readiness:
    """200 when Redis answers and at least one worker is live; 503 naming what is missing."""
    workers = await probes.live_workers()
    return Readiness(live_workers=len(workers), models=sorted({worker.model for worker in workers}))


@router.get("/version", response_model=Version)
async def version() -> Version:
    """The running version, so operators can tell replicas apart during a rollout."""
    return Version(version=__version__, protocol_version=PROTOCOL_VERSION)
