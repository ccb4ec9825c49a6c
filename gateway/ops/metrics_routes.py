"""Owns GET /metrics: the gateway's Prometheus exposition, left out of the OpenAPI schema.

Open by default, since scrapers usually hold no API key; ``metrics_require_key``
puts it behind the same key check as the API (``gateway/http/app.py`` decides).
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.ops.probes import ProbesDep

router = APIRouter(tags=["operations"])


@router.get("/metrics", include_in_schema=False)
async def metrics(probes: ProbesDep) -> Response:
    """Every gateway metric, with queue depths read from Redis now."""
    return Response(await probes.scrape(), media_type=CONTENT_TYPE_LATEST)
