"""Owns GET /metrics: the gateway's Prometheus exposition, left out of the OpenAPI schema.

Open by default, since scrapers usually hold no API key; ``metrics_require_key``
puts it behind the same key check as the API (``gateway/http/app.py`` decides).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.http.deps import PoolDep
from gateway.ops.metrics import GatewayMetrics

router = APIRouter(tags=["operations"])


def get_metrics(request: Request) -> GatewayMetrics:
    metrics = getattr(request.app.state, "metrics", None)
    if not isinstance(metrics, GatewayMetrics):
        raise RuntimeError("gateway metrics missing: the app was not built by create_app")
    return metrics


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request, pool: PoolDep) -> Response:
    """Every gateway metric, with queue depths read from Redis now."""
    gateway_metrics = get_metrics(request)
    await gateway_metrics.refresh_queue_depths(pool)
    return Response(gateway_metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
