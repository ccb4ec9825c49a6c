"""Owns what /openapi.json declares beyond each route's 200 JSON body: error and streaming responses.

Every status a route can answer is declared with the body it really carries, so
clients generated from the schema (and schemathesis's conformance checks) see the
truth: OpenAI routes answer errors in OpenAI's envelope, TGI routes in TGI's
shape, and streamed answers are ``text/event-stream``. The body limit answers 413
before routing, so it is OpenAI's envelope on every route.
"""

from __future__ import annotations

from typing import Any

from gateway.openai_schema import ErrorBody
from gateway.tgi_schema import TgiErrorBody

Responses = dict[int | str, dict[str, Any]]

_DESCRIPTIONS = {
    400: "Invalid request: the message and `param` name the problem.",
    401: "Missing or unknown API key (only when keys are configured).",
    404: "Unknown model or route.",
    413: "Request body larger than the configured limit.",
    415: "Body not declared as application/json.",
    422: "Invalid request (TGI's status for validation errors).",
    429: "Overloaded or rate limited; see Retry-After.",
    499: "The client closed the connection before the answer was ready.",
    500: "The worker failed.",
    503: "Redis unreachable or no worker serving the model right now.",
    504: "The request's deadline passed.",
}
_GENERATION_STATUSES = (400, 401, 404, 413, 415, 429, 499, 500, 503, 504)
_READ_STATUSES = (401, 404, 503)


def _errors(model: type, statuses: tuple[int, ...]) -> Responses:
    return {status: {"model": model, "description": _DESCRIPTIONS[status]} for status in statuses}


# Declaring the 4XX range also keeps FastAPI from adding its 422 schema: OpenAI routes never answer 422.
_ANY_CLIENT_ERROR: Responses = {
    "4XX": {"model": ErrorBody, "description": "Any other client error (405...)."}
}


def _event_stream(description: str) -> Responses:
    schema = {"type": "string", "description": description}
    return {200: {"content": {"text/event-stream": {"schema": schema}}}}


# OpenAI routes: generation routes may stream; the others only read the registry.
OPENAI_GENERATION = {
    **_errors(ErrorBody, _GENERATION_STATUSES),
    **_ANY_CLIENT_ERROR,
    **_event_stream("With stream=true: `data:` chunk objects, then `data: [DONE]`."),
}
OPENAI_READ = {**_errors(ErrorBody, _READ_STATUSES), **_ANY_CLIENT_ERROR}

# TGI routes answer bad requests with 422 and their errors in TGI's shape, except the 413.
_TGI_GENERATION_STATUSES = (401, 404, 415, 422, 429, 499, 500, 503, 504)
TGI_GENERATION = {**_errors(TgiErrorBody, _TGI_GENERATION_STATUSES), **_errors(ErrorBody, (413,))}
TGI_STREAM = _event_stream("`data:` StreamResponse events; the last has generated_text and details.")
TGI_COMPAT = {**TGI_GENERATION, **TGI_STREAM}
TGI_READ = {**_errors(TgiErrorBody, (401, 422, 503)), **_errors(ErrorBody, (413,))}
