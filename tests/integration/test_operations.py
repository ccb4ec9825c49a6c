"""The operational probes against a real Redis: /ready says what is missing, quickly; /version answers."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from dirty_equals import IsStr
from redis.asyncio import Redis

from gateway.http.app import create_app
from shared import __version__
from shared.protocol import PROTOCOL_VERSION
from shared.redis_server import EmbeddedRedis
from shared.settings import GatewaySettings
from tests.helpers import FAKE_MODEL, running_stack


@contextlib.asynccontextmanager
async def gateway_only(redis_url: str, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(GatewaySettings(redis_url=redis_url, **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=10) as client:
            yield client


async def test_ready_with_a_live_worker_lists_its_model(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        response = await client.get("/ready")

    assert response.status_code == 200
    assert response.json() == {"status": "ready", "redis": "ok", "live_workers": 1, "models": [FAKE_MODEL]}


async def test_ready_without_a_worker_is_503_saying_so(redis: Redis, redis_url: str) -> None:
    async with gateway_only(redis_url) as client:
        response = await client.get("/ready")

    assert response.status_code == 503
    assert response.json() == {
        "error": {
            "message": "Not ready: no worker is live.",
            "type": "service_unavailable_error",
            "param": None,
            "code": "no_live_worker",
        }
    }


async def test_ready_with_redis_gone_is_503_within_the_probe_timeout(redis: Redis) -> None:
    with EmbeddedRedis() as private:
        async with gateway_only(private.url) as client:
            private.stop()
            started = time.monotonic()
            response = await client.get("/ready")
            elapsed = time.monotonic() - started

    assert response.status_code == 503
    assert response.json()["error"] == {
        "message": IsStr(regex=r"Not ready: Redis is unreachable .*"),
        "type": "service_unavailable_error",
        "param": None,
        "code": "service_unavailable",
    }
    assert elapsed < 3.0


async def test_probes_need_no_api_key(redis: Redis, redis_url: str) -> None:
    async with gateway_only(redis_url, api_keys=["secret"]) as client:
        ready = await client.get("/ready")
        version = await client.get("/version")
        models = await client.get("/v1/models")

    assert ready.status_code == 503  # answered, not refused: no worker runs here
    assert (version.status_code, version.json()) == (
        200,
        {"version": __version__, "protocol_version": PROTOCOL_VERSION},
    )
    assert models.status_code == 401
