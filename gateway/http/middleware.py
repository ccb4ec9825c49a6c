"""Owns the ASGI layers every HTTP request passes first: its request id and its body-size limit.

Both are pure ASGI middleware (``gateway/http/asgi.py`` says why).

Intentional divergence: the body limit reads the whole body (at most
``max_body_bytes``) before the app runs, instead of raising mid-read. FastAPI
turns any non-HTTP exception raised while it reads a body into a generic 400, so
a limit enforced inside the read could not answer 413 in our error shape. Our
bodies are small JSON documents that are parsed whole anyway, so buffering costs nothing;
and only authenticated callers' bodies are buffered, since the auth gate
(``gateway/http/auth_gate.py``) runs first.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.asgi import HttpMiddleware, on_response_start
from gateway.http.errors import error_response
from gateway.http.request_ids import REQUEST_ID_HEADER, new_request_id, remember, request_id_of
from shared.errors import PayloadTooLarge
from shared.logs import request_id_var


class RequestIdMiddleware(HttpMiddleware):
    """Give each request a fresh id: in the scope, in log lines, and in the response header."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = new_request_id()
        remember(scope, request_id)
        token = request_id_var.set(request_id)
        try:
            await self.app(scope, receive, on_response_start(send, _request_id_header(request_id)))
        finally:
            request_id_var.reset(token)


def _request_id_header(request_id: str) -> Callable[[Message], None]:
    def add_header(message: Message) -> None:
        headers = MutableHeaders(scope=message)
        if REQUEST_ID_HEADER not in headers:
            headers.append(REQUEST_ID_HEADER, request_id)

    return add_header


class BodyLimitMiddleware(HttpMiddleware):
    """Answer 413 to a body over ``max_body_bytes``, by its Content-Length or by counting.

    ``path_limits`` raises the limit of named paths (file uploads carry far more than JSON bodies).
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, path_limits: dict[str, int] | None = None) -> None:
        super().__init__(app)
        self.max_body_bytes = max_body_bytes
        self.path_limits = path_limits or {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.path_limits.get(scope["path"], self.max_body_bytes)
        declared = _declared_length(scope)
        body = None if declared > limit else await _read_body(receive, limit)
        if body is None:
            await self._reject(scope, receive, send, limit)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        error = PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")
        await error_response(error, request_id_of(scope))(scope, receive, send)


def _declared_length(scope: Scope) -> int:
    try:
        return int(Headers(scope=scope).get("content-length", "0"))
    except ValueError:
        return 0  # a malformed header is left to the server; the counted size still applies


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it passes ``limit``; a disconnect ends it early."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the app sees the disconnect on its next receive
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands out the buffered body once, then the real channel (disconnects)."""
    is_replayed = False

    async def replaying_receive() -> Message:
        nonlocal is_replayed
        if is_replayed:
            return await receive()
        is_replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replaying_receive
