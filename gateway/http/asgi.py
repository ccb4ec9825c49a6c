"""Owns the pure-ASGI plumbing the gateway's middleware share: HTTP-only handling and response-start edits.

Every middleware here is pure ASGI rather than ``BaseHTTPMiddleware``, which would
buffer streamed responses and run the app in a separate task (losing the
request-id contextvar for log lines). ``HttpMiddleware`` is the one base they
share (one level, nothing abstract to fill in): it passes lifespan and websocket
scopes straight through and hands each HTTP request to ``handle``.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HttpMiddleware:
    """A pure ASGI middleware acting on HTTP requests only; other scopes go straight to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.handle(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request; this base only passes it on."""
        await self.app(scope, receive, send)


def on_response_start(send: Send, edit: Callable[[Message], None]) -> Send:
    """``send`` that first shows the response's start message (status, headers) to ``edit``."""

    async def edited_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            edit(message)
        await send(message)

    return edited_send
