"""Owns what the operational routes read from Redis: readiness (Redis answers, a worker is live) and a scrape.

Every Redis call for /ready runs under ``READY_TIMEOUT_S``: a probe that hangs
while Redis is down would be worse than one that says so, and orchestrators time
probes out after ~1 s anyway. A /metrics scrape reads the queue depths under the
metrics' own deadline (``gateway/ops/metrics.py``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.dispatch.groups import GroupPools
from gateway.http.deps import get_state
from gateway.ops.metrics import GatewayMetrics
from shared.errors import NoLiveWorker, Unavailable
from shared.registry import WorkerInfo

# Redis answers PING in well under a millisecond; a second means it is gone or wedged.
READY_TIMEOUT_S = 1.0


class Probes:
    """The Redis reads behind /ready and /metrics; built per request."""

    def __init__(self, groups: GroupPools, metrics: GatewayMetrics) -> None:
        self._groups = groups
        self._redis: Redis = groups.home
        self._metrics = metrics

    async def live_workers(self) -> list[WorkerInfo]:
        """The live workers, when Redis answers and there is at least one; else 503 naming what is missing."""
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await self._redis.ping()
                workers = await self._groups.live_workers()  # every model group's
        except (RedisError, OSError, TimeoutError) as exc:
            raise Unavailable(f"Not ready: Redis is unreachable ({type(exc).__name__}).") from exc
        if not workers:
            raise NoLiveWorker("Not ready: no worker is live.")
        return workers

    async def scrape(self) -> bytes:
        """Every gateway metric in Prometheus' text format, with queue depths read from Redis now."""
        await self._metrics.refresh_queue_depths(self._redis, list(self._groups.by_url().values()))
        return self._metrics.exposition()


def get_metrics(request: Request) -> GatewayMetrics:
    metrics = getattr(request.app.state, "metrics", None)
    if not isinstance(metrics, GatewayMetrics):
        raise RuntimeError("gateway metrics missing: the app was not built by create_app")
    return metrics


async def get_probes(request: Request) -> Probes:
    return Probes(get_state(request).groups, get_metrics(request))


ProbesDep = Annotated[Probes, Depends(get_probes)]
