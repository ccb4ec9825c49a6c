"""Owns optional bearer-key authentication: every route but /health, when keys are configured.

Keys are compared with ``hmac.compare_digest`` against every configured key (no
early exit), so timing reveals neither a key's prefix nor which key matched.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from fastapi import Request
from fastapi.security import HTTPBearer

from shared.errors import Unauthorized


class ApiKeyGuard:
    """A dependency refusing requests without one of the keys; open when there are none."""

    def __init__(self, api_keys: Sequence[str]) -> None:
        self._known = tuple(key.encode() for key in api_keys)
        self._bearer = HTTPBearer(auto_error=False)

    async def __call__(self, request: Request) -> None:
        if not self._known:
            return
        credentials = await self._bearer(request)
        if credentials is None or not is_known_key(credentials.credentials, self._known):
            raise Unauthorized("Incorrect API key provided.")


def is_known_key(given: str, known: Sequence[bytes]) -> bool:
    given_bytes = given.encode()
    matches = [hmac.compare_digest(given_bytes, key) for key in known]
    return any(matches)
