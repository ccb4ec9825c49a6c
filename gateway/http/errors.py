"""Owns the mapping of every failure to OpenAI's error JSON and HTTP status.

One handler, ``handle_error``, is registered for all exception kinds: domain
errors, FastAPI validation errors (400, never 422), Starlette HTTP errors (404
routes, 405), Redis being unreachable (503 at once rather than a hang or a 500)
and anything unexpected (500, logged with its traceback). ``to_domain_error`` is
the single conversion; the SSE relay uses it too for failures after streaming began.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from gateway.http.request_ids import REQUEST_ID_HEADER, request_id_of
from gateway.openai.schema import ErrorBody, ErrorObject
from shared.errors import (
    ErrorInfo,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    TokenferryError,
    Unavailable,
    error_from_info,
)

logger = logging.getLogger(__name__)

_REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError)
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_HANDLED = (TokenferryError, RequestValidationError, StarletteHTTPException, *_REDIS_ERRORS, Exception)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception kind to ``handle_error``."""
    for kind in _HANDLED:
        app.add_exception_handler(kind, handle_error)


async def handle_error(request: Request, exc: Exception) -> Response:
    """Render any exception as OpenAI's error JSON with the matching status."""
    error = to_domain_error(exc, request)
    # A readiness probe's 503 is its answer while the cluster starts, not a server fault.
    if error.status >= 500 and request.url.path != "/ready":
        logger.warning("answered %d %s: %s", error.status, error.code, error.message)
    else:
        logger.info("answered %d %s param=%s", error.status, error.code, error.param)
    headers = dict(exc.headers or {}) if isinstance(exc, StarletteHTTPException) else {}
    if "allow" in {name.lower() for name in headers}:
        headers = {name: value for name, value in headers.items() if name.lower() != "allow"}
        headers["Allow"] = allowed_methods(request)
    return error_response(error, request_id_of(request.scope), headers)


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path, for a 405's ``Allow``.

    Starlette lists only the first matching route's methods, which is wrong for a
    path served by several routes (GET and POST /admin/keys, say). Each method is
    probed through the routes' public ``matches``, which sees into included routers.
    """
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    )


def to_domain_error(exc: BaseException, request: Request | None = None) -> TokenferryError:
    """The domain error an exception means to the client; unexpected ones are logged here."""
    if isinstance(exc, TokenferryError):
        return exc
    if isinstance(exc, RequestValidationError):
        return validation_error(exc.errors())
    if isinstance(exc, StarletteHTTPException):
        return _http_error(exc, request)
    if isinstance(exc, _REDIS_ERRORS):
        # Redis' own text names its address: logged here, never sent.
        logger.warning("Redis unreachable: %s", exc)
        return Unavailable("The service cannot reach its queue right now; please retry shortly.")
    logger.exception("unexpected error", exc_info=exc)
    return TokenferryError("The server had an error while processing your request.")


_MODELS_NAMED = 20  # a longer list would bury the message; the rest are counted


def unknown_model(model: str, served: Iterable[str]) -> ModelNotFound:
    """OpenAI's 404 for a model nobody serves, naming the models that are served (a typo shows at once)."""
    names = sorted(set(served))
    if not names:
        listing = "No model is served here right now."
    else:
        shown = ", ".join(names[:_MODELS_NAMED])
        more = f" and {len(names) - _MODELS_NAMED} more" if len(names) > _MODELS_NAMED else ""
        listing = f"Served models: {shown}{more}."
    return ModelNotFound(
        f"The model `{model}` does not exist or is not served here. {listing}", param="model"
    )


def error_body(error: TokenferryError) -> ErrorBody:
    return ErrorBody(
        error=ErrorObject(message=error.message, type=error.type, param=error.param, code=error.code)
    )


def error_response(
    error: TokenferryError, request_id: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The HTTP response for ``error``: OpenAI's envelope, status, Retry-After, request id."""
    all_headers = dict(headers or {})
    if isinstance(error, Overloaded):
        all_headers["Retry-After"] = str(error.retry_after_s)
    if request_id is not None:
        # Errors rendered outside the middleware (500s) still carry the id.
        all_headers[REQUEST_ID_HEADER] = request_id
    return JSONResponse(error_body(error).model_dump(), status_code=error.status, headers=all_headers)


def validation_error(errors: Sequence[Any]) -> InvalidRequest:
    """One 400 naming the first problem; ``param`` is its location without "body"."""
    first = errors[0]
    location = [str(part) for part in first["loc"]]
    if location[:1] == ["body"]:
        location = location[1:]
    if location[-1:] == ["[key]"]:
        location = location[:-2]  # a bad key is the map's problem: name the map, not the key
    param = ".".join(location) or None
    message = _describe(first, param)
    if len(errors) > 1:
        others = len(errors) - 1
        message += f" (The request has {others} other problem{'' if others == 1 else 's'}.)"
    if first["type"] == "json_invalid":
        param = None  # the location is a character offset, not a parameter
    return InvalidRequest(message, param=param)


def _describe(error: Mapping[str, Any], param: str | None) -> str:
    kind = error["type"]
    if kind == "json_invalid":
        reason = error.get("ctx", {}).get("error", "invalid JSON")
        return f"The request body is not valid JSON ({reason} at character {param})."
    if param is None and kind == "missing":
        return "The request body is empty; send a JSON object."
    if param is None:
        return "The request body must be a JSON object."
    if kind == "missing":
        return f"Missing required parameter: '{param}'."
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}."  # OpenAI's words
    message = str(error["msg"])
    return f"Invalid '{param}': {message}" + ("" if message.endswith(".") else ".")


def _http_error(exc: StarletteHTTPException, request: Request | None) -> TokenferryError:
    if isinstance(exc.__cause__, UnicodeDecodeError):
        # FastAPI's body parser says only "There was an error parsing the body".
        return InvalidRequest(
            f"The request body is not valid UTF-8 ({exc.__cause__.reason} at byte {exc.__cause__.start})."
        )
    if exc.status_code == 404 and request is not None:
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif exc.status_code == 405 and request is not None:
        message = f"Method {request.method} is not allowed for {request.url.path}."
    else:
        message = str(exc.detail)
    info = ErrorInfo(message=message, type="invalid_request_error", status=exc.status_code)
    return error_from_info(info)
