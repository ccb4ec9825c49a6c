"""Owns how TGI routes answer errors: TGI's ``{"error", "error_type"}`` body and status.

TGI clients read that shape (``huggingface_hub`` raises ``ValidationError``,
``OverloadedError``... by ``error_type``), so the TGI routes use ``TgiRoute``,
which renders every exception raised while handling the request (dependencies
and body validation included) through the same ``to_domain_error`` as the OpenAI
handler, then ``tgi_translate.tgi_error``. Errors raised before routing (the body
limit's 413, unknown routes) keep OpenAI's envelope.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from gateway.http.errors import to_domain_error
from gateway.http.request_ids import REQUEST_ID_HEADER, request_id_of
from gateway.tgi.translate import tgi_error
from shared.errors import Overloaded, TokenferryError

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class TgiRoute(APIRoute):
    """An APIRoute whose failures answer in TGI's error shape."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # every failure becomes an answer; unexpected ones are logged
                return tgi_error_response(to_domain_error(exc, request), request_id_of(request.scope))

        return handle


def tgi_error_response(error: TokenferryError, request_id: str | None) -> JSONResponse:
    status, body = tgi_error(error)
    logger.info("answered %d %s (tgi): %s", status, body.error_type, error.message)
    headers = {REQUEST_ID_HEADER: request_id} if request_id else {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(error.retry_after_s)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)
