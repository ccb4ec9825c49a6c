"""Owns JSON encoding of jobs and stream entries, and arq's serializer pair.

Never pickle: a queue that unpickles is remote code execution for anyone who can
write to Redis. arq hands its serializer a plain dict of JSON-able values
(function name, args, kwargs, try, enqueue time), so ``json`` is enough.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from shared.protocol import GenerationJob, TokenEvent

# A stream entry is one field holding the event's JSON.
EVENT_FIELD = "e"

_event_adapter: TypeAdapter[TokenEvent] = TypeAdapter(TokenEvent)


class CodecError(ValueError):
    """A payload on Redis is not something this version understands."""


def encode_job(job: GenerationJob) -> dict[str, Any]:
    return job.model_dump(mode="json")


def decode_job(payload: object) -> GenerationJob:
    try:
        return GenerationJob.model_validate(payload)
    except ValidationError as error:
        raise CodecError(f"invalid generation job: {error}") from error


def encode_event(event: TokenEvent) -> dict[str, str]:
    return {EVENT_FIELD: event.model_dump_json()}


def decode_event(fields: dict[bytes, bytes] | dict[str, str]) -> TokenEvent:
    raw = fields.get(EVENT_FIELD) or fields.get(EVENT_FIELD.encode())  # type: ignore[call-overload]
    if raw is None:
        raise CodecError("stream entry has no event field")
    try:
        return _event_adapter.validate_json(raw)
    except ValidationError as error:
        raise CodecError(f"invalid token event: {error}") from error


def serialize_arq_job(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def deserialize_arq_job(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise CodecError("arq job payload is not a JSON object")
    return data
