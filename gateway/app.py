"""Owns the gateway's composition: ``create_app(settings)`` wires every part of the HTTP tier.

Nothing is built at import time. The lifespan opens the arq pool (also our Redis
client) and yields a typed state that ``gateway/deps.py`` hands to handlers.

Intentional divergence: the lifespan also keeps that state on ``app.state`` (this
app's own object, not a module global), and handlers read it there. Yielded
lifespan state reaches requests only through the server, which copies it into
each scope; in-process transports such as httpx's ``ASGITransport`` do not, and
the app must behave the same under both.
With Redis unreachable at start the lifespan fails fast instead of serving 503s
forever; once running, a lost Redis answers 503 per request (``gateway/errors.py``).
Importing this module pulls in no torch, transformers or worker code.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import Depends, FastAPI

from gateway.auth import ApiKeyGuard
from gateway.deps import GatewayState, LifespanState
from gateway.dispatch import Dispatcher
from gateway.errors import install_error_handlers
from gateway.middleware import BodyLimitMiddleware, RequestIdMiddleware
from gateway.routes import chat, completions, health, models
from shared import __version__, jobqueue
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
    # Added last runs first: the request id must exist before the body limit can answer 413.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RequestIdMiddleware)
    guard = [Depends(ApiKeyGuard(settings.api_keys))]
    app.include_router(health.router)
    for router in (chat.router, completions.router, models.router):
        app.include_router(router, dependencies=guard)
    return app


def _lifespan(settings: GatewaySettings) -> Callable[[FastAPI], AbstractAsyncContextManager[LifespanState]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[LifespanState]:
        pool = await jobqueue.open_pool(settings.redis_url)
        dispatcher = Dispatcher(pool, settings.request_timeout_s)
        logger.info(
            "gateway ready: auth=%s timeout=%.0fs",
            "on" if settings.api_keys else "off",
            settings.request_timeout_s,
        )
        state = GatewayState(pool=pool, dispatcher=dispatcher)
        app.state.gateway = state
        try:
            yield {"gateway": state}
        finally:
            del app.state.gateway
            await pool.aclose()
            logger.info("gateway stopped")

    return lifespan
