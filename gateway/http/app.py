"""Owns the gateway's composition: ``create_app(settings)`` wires every part of the HTTP tier.

Nothing is built at import time. The lifespan opens the arq pool (also our Redis
client) and yields a typed state that ``gateway/http/deps.py`` hands to handlers.
With ``--redis-groups`` it opens one more pool per model group's Redis, alike
(``gateway/dispatch/groups.py``).

Intentional divergence: the lifespan also keeps that state on ``app.state`` (this
app's own object, not a module global), and handlers read it there. Yielded
lifespan state reaches requests only through the server, which copies it into
each scope; in-process transports such as httpx's ``ASGITransport`` do not, and
the app must behave the same under both.
With Redis unreachable at start the lifespan fails fast instead of serving 503s
forever; once running, a lost Redis answers 503 per request (``gateway/http/errors.py``).
Importing this module pulls in no torch, transformers or worker code.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI
from fastapi.routing import APIRoute
from starlette.middleware.cors import CORSMiddleware

from gateway.access import routes as admin
from gateway.access.auth import Authenticator, Limits, static_keys
from gateway.access.rate_limits import RATE_LIMIT_HEADERS, RateLimitHeadersMiddleware, RateLimits
from gateway.access.stream_slots import StreamSlots
from gateway.background import work
from gateway.batches import routes as batches
from gateway.dispatch import routes as streams
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.groups import GroupPools
from gateway.http.auth_gate import AuthGate
from gateway.http.deps import GatewayState, LifespanState, guard_request
from gateway.http.errors import install_error_handlers
from gateway.http.middleware import BodyLimitMiddleware, RequestIdMiddleware
from gateway.http.openapi import OPENAI_ADMIN, OPENAI_BACKGROUND, OPENAI_GENERATION, OPENAI_READ
from gateway.http.sse import SEND_TIMEOUT_S
from gateway.openai import routes as openai
from gateway.ops import health_routes as health
from gateway.ops import metrics_routes
from gateway.ops.metrics import GatewayMetrics, RequestMetricsMiddleware
from gateway.responses_api import routes as responses
from gateway.tgi import routes as tgi
from gateway.tgi.errors import tgi_error_response
from gateway.tokenize import routes as tokenize
from shared import __version__
from shared.access.token_buckets import TokenBuckets
from shared.jobs import jobqueue
from shared.jobs.arq_seam import QueuePool
from shared.settings import GatewaySettings

logger = logging.getLogger(__name__)


def create_app(settings: GatewaySettings) -> FastAPI:
    """The gateway ASGI app for ``settings``; run it under a server that runs its lifespan."""
    app = FastAPI(
        title="tokenferry",
        version=__version__,
        summary="OpenAI-compatible gateway: validates, enqueues and relays generation jobs.",
        lifespan=_lifespan(settings),
    )
    install_error_handlers(app)
    _install_middleware(app, settings)
    guard = [Depends(guard_request)]
    app.include_router(health.router)
    app.include_router(metrics_routes.router, dependencies=guard if settings.metrics_require_key else [])
    for router in (openai.router, responses.router):
        app.include_router(router, dependencies=guard, responses=OPENAI_GENERATION)
    app.include_router(openai.models_router, dependencies=guard, responses=OPENAI_READ)
    app.include_router(tokenize.router, dependencies=guard, responses=OPENAI_READ)
    app.include_router(streams.router, dependencies=guard, responses=OPENAI_READ)
    app.include_router(admin.router, dependencies=guard, responses=OPENAI_ADMIN)
    for router in (batches.files_router, batches.batches_router):
        app.include_router(router, dependencies=guard, responses=OPENAI_BACKGROUND)
    app.include_router(tgi.router, dependencies=guard)
    return app


def _install_middleware(app: FastAPI, settings: GatewaySettings) -> None:
    """The ASGI layers around every route, in the order each request meets them (the last added first)."""
    # Added last runs first: the request id must exist before the body limit can answer 413,
    # and the key is checked before the body limit reads (buffers) any of the body.
    app.add_middleware(RateLimitHeadersMiddleware)
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        path_limits={"/v1/files": settings.max_file_bytes + batches.MULTIPART_OVERHEAD_BYTES},
    )
    app.add_middleware(
        AuthGate,
        open_paths=open_paths(app, settings),
        error_renderers=dict.fromkeys(_paths(tgi.router), tgi_error_response),
    )
    app.add_middleware(RequestIdMiddleware)
    # Outside the body limit and request ids, so 413s are counted too; one registry per app.
    app.state.metrics = GatewayMetrics()
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)
    if settings.cors_allow_origins:
        # Outermost, so preflights never reach auth and error responses carry CORS headers too.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["*"],
            expose_headers=["x-request-id", "retry-after", *RATE_LIMIT_HEADERS],
        )


def open_paths(app: FastAPI, settings: GatewaySettings) -> set[str]:
    """The paths answered without a key: the probes, and /metrics and the API docs where settings say."""
    paths = _paths(health.router)
    if not settings.metrics_require_key:
        paths |= _paths(metrics_routes.router)
    if not settings.docs_require_key:
        docs = (app.openapi_url, app.docs_url, app.swagger_ui_oauth2_redirect_url, app.redoc_url)
        paths |= {path for path in docs if path}
    return paths


def _paths(router: APIRouter) -> set[str]:
    return {route.path for route in router.routes if isinstance(route, APIRoute)}


def _lifespan(settings: GatewaySettings) -> Callable[[FastAPI], AbstractAsyncContextManager[LifespanState]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[LifespanState]:
        groups = await _open_pools(settings)
        pool = groups.home
        dispatcher = Dispatcher(
            groups,
            settings.request_timeout_s,
            settings.max_queued_requests,
            stream_readers=settings.stream_readers,
        )
        state = build_state(settings, groups, dispatcher)
        logger.info(
            "gateway ready: auth=%s timeout=%.0fs",
            "on" if await state.authenticator.is_enabled() else "off (no keys configured)",
            settings.request_timeout_s,
        )
        app.state.gateway = state
        try:
            async with work.running(app, settings, groups):
                yield {"gateway": state}
        finally:
            del app.state.gateway
            await app.state.metrics.release_queue_depths(pool)
            await dispatcher.aclose()
            await groups.aclose()
            await pool.aclose()
            logger.info("gateway stopped")

    return lifespan


async def _open_pools(settings: GatewaySettings) -> GroupPools:
    """The home Redis's pool, and one alike for each model group's Redis (all or none)."""

    def open_pool(url: str) -> Awaitable[QueuePool]:
        return jobqueue.open_pool(
            url,
            connect_timeout_s=settings.redis_timeout_s,
            max_connections=settings.redis_max_connections,
            wait_s=settings.redis_timeout_s,
        )

    home = await open_pool(settings.redis_url)
    try:
        return await GroupPools.open(settings.model_groups(), home, open_pool)
    except BaseException:
        await home.aclose()
        raise


def build_state(settings: GatewaySettings, groups: GroupPools, dispatcher: Dispatcher) -> GatewayState:
    """The handlers' state around open pools (the lifespan's; tests build it around a fake)."""
    pool = groups.home
    limits = Limits(rpm=settings.rate_limit_rpm, tpm=settings.rate_limit_tpm)
    keys = static_keys(settings.api_keys, settings.admin_api_keys)
    return GatewayState(
        pool=pool,
        dispatcher=dispatcher,
        groups=groups,
        authenticator=Authenticator(pool, keys, limits, settings.auth_cache_s),
        rate_limits=RateLimits(TokenBuckets(pool)),
        # Every relay ends by the request timeout; a drain and a slow reader may add their own.
        streams=StreamSlots(
            pool,
            settings.max_streams_per_tenant,
            lifetime_s=settings.request_timeout_s + settings.drain_grace_s + SEND_TIMEOUT_S,
        ),
        max_tokens_limit=settings.max_tokens_limit,
        max_choices=settings.max_n,
        drain_grace_s=settings.drain_grace_s,
    )
