"""Owns the per-request id: how it is made, where the ASGI scope keeps it, its response header.

The id doubles as the arq job id, and arq must never see an id twice (aborting
an unknown id poisons a later job with that id), so it is always generated here
and never taken from the client's own ``x-request-id``.
"""

from __future__ import annotations

import secrets
from collections.abc import MutableMapping
from typing import Any

REQUEST_ID_HEADER = "x-request-id"
# Kept in the scope's "state" mapping, so handlers also reach it as request.state.request_id.
_STATE_KEY = "request_id"


# 128 random bits: the id is also what a client names to resume its stream, so it must be
# unguessable (uuid4 has only 122); ownership checks (gateway/access/ownership.py) are the second line.
REQUEST_ID_BYTES = 16


def new_request_id() -> str:
    return secrets.token_hex(REQUEST_ID_BYTES)


def remember(scope: MutableMapping[str, Any], request_id: str) -> None:
    """Store ``request_id`` in the scope every later layer of this request shares."""
    scope.setdefault("state", {})[_STATE_KEY] = request_id


def request_id_of(scope: MutableMapping[str, Any]) -> str | None:
    """The id stored by ``remember``, or None outside the request-id middleware."""
    request_id = scope.get("state", {}).get(_STATE_KEY)
    return request_id if isinstance(request_id, str) else None
