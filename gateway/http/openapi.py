"""Owns what /openapi.json declares beyond each route's 200 JSON body: error and streaming responses.

Every status a route can answer is declared with the body it really carries, so
clients generated from the schema (and schemathesis's conformance checks) see the
truth: OpenAI routes answer errors in OpenAI's envelope, TGI routes in TGI's
shape, and streamed answers are ``text/event-stream``. The body limit answers 413
before routing, so it is OpenAI's envelope on every route.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.openai.schema import ErrorBody
from gateway.tgi.schema import StreamResponse, TgiErrorBody

Responses = dict[int | str, dict[str, Any]]

_DESCRIPTIONS = {
    400: "Invalid request: the message and `param` name the problem.",
    401: "Missing or unknown API key (only when keys are configured).",
    403: "The key may not use this endpoint.",
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
# 429: every keyed route spends the key's requests-per-minute (gateway/access/rate_limits.py).
_READ_STATUSES = (401, 404, 429, 503)


def _errors(model: type, statuses: tuple[int, ...]) -> Responses:
    return {status: {"model": model, "description": _DESCRIPTIONS[status]} for status in statuses}


# Declaring the 4XX range also keeps FastAPI from adding its 422 schema: OpenAI routes never answer 422.
_ANY_CLIENT_ERROR: Responses = {
    "4XX": {"model": ErrorBody, "description": "Any other client error (405...)."}
}


def _event_stream(description: str, data: dict[str, Any]) -> Responses:
    """A 200 streamed as server-sent events; the schema is each event's, as schemathesis reads it."""
    event = {"type": "object", "required": ["data"], "properties": {"data": data}, "description": description}
    return {200: {"content": {"text/event-stream": {"schema": event}}}}


def _json_text(model: type[BaseModel]) -> dict[str, Any]:
    """A string holding one JSON document of ``model`` (its schema inlined: no shared $defs here)."""
    schema = model.model_json_schema()
    return {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": _inline(schema, schema),
    }


def _inline(node: Any, root: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(item, root) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inline(root["$defs"][node["$ref"].rsplit("/", 1)[-1]], root)
    return {key: _inline(value, root) for key, value in node.items() if key != "$defs"}


# OpenAI routes: generation routes may stream; the others only read the registry.
OPENAI_GENERATION = {
    **_errors(ErrorBody, _GENERATION_STATUSES),
    **_ANY_CLIENT_ERROR,
    # Chunks are JSON and the last data is the bare word [DONE], so the data stays a plain string here.
    **_event_stream("With stream=true: `data:` chunk objects, then `data: [DONE]`.", {"type": "string"}),
}
OPENAI_READ = {**_errors(ErrorBody, _READ_STATUSES), **_ANY_CLIENT_ERROR}
OPENAI_ADMIN = {**_errors(ErrorBody, (400, 401, 403, 404, 413, 415, 429, 503)), **_ANY_CLIENT_ERROR}
# Files and batches: uploads may be too large, ids may be unknown; nothing streams.
OPENAI_BACKGROUND = {**_errors(ErrorBody, (400, 401, 404, 413, 415, 429, 503)), **_ANY_CLIENT_ERROR}

# TGI routes answer bad requests with 422 and their errors in TGI's shape, except the 413.
_TGI_GENERATION_STATUSES = (401, 404, 415, 422, 429, 499, 500, 503, 504)
TGI_GENERATION = {**_errors(TgiErrorBody, _TGI_GENERATION_STATUSES), **_errors(ErrorBody, (413,))}
TGI_STREAM = _event_stream(
    "`data:` StreamResponse events; the last has generated_text and details; a failure, TgiErrorBody.",
    {"anyOf": [_json_text(StreamResponse), _json_text(TgiErrorBody)]},
)
TGI_COMPAT = {**TGI_GENERATION, **TGI_STREAM}
TGI_READ = {**_errors(TgiErrorBody, (401, 404, 422, 429, 503)), **_errors(ErrorBody, (413,))}
