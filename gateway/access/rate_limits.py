"""Owns per-key rate limiting at the HTTP edge: charging buckets, 429s and ``x-ratelimit-*`` headers.

Every request of a keyed caller takes one unit of its requests-per-minute bucket
(refused requests count too, as at OpenAI, so hammering does not help). A
generation request also takes its token estimate from the tokens-per-minute
bucket (``gateway/access/quota.py``); other requests only read that bucket, so
their headers still say where it stands. Both buckets are taken together and
atomically by ``shared/access/token_buckets.py`` across all gateway replicas.

The headers are OpenAI's: ``x-ratelimit-limit-requests``,
``x-ratelimit-remaining-requests``, ``x-ratelimit-reset-requests`` (time until
the bucket is full again, as ``1s``, ``6m0s`` or ``250ms``) and the ``-tokens``
variants. The latest state is kept in the request's scope state, and
``RateLimitHeadersMiddleware`` adds it to whatever response goes out, errors
included. Callers without limits (anonymous, or no limit configured) get no
headers and cost no Redis round trip.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from enum import StrEnum
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import Message, Receive, Scope, Send

from gateway.access.auth import Principal
from gateway.http.asgi import HttpMiddleware, on_response_start
from shared import keys
from shared.access.token_buckets import BucketState, Take, TokenBuckets
from shared.errors import RateLimited, RequestRateLimited, TokenRateLimited

_STATE_KEY = "ratelimit"
_HEADER_PREFIX = "x-ratelimit-"


class Resource(StrEnum):
    REQUESTS = "requests"
    TOKENS = "tokens"


RATE_LIMIT_HEADERS = [
    f"{_HEADER_PREFIX}{field}-{resource}"
    for resource in Resource
    for field in ("limit", "remaining", "reset")
]
_REFUSALS: dict[Resource, type[RateLimited]] = {
    Resource.REQUESTS: RequestRateLimited,
    Resource.TOKENS: TokenRateLimited,
}
_UNITS = {Resource.REQUESTS: "requests per min (RPM)", Resource.TOKENS: "tokens per min (TPM)"}


class RateLimits:
    """Charges principals' buckets; one per gateway process."""

    def __init__(self, buckets: TokenBuckets) -> None:
        self._buckets = buckets

    async def charge_request(self, principal: Principal, state: MutableMapping[str, Any]) -> None:
        """Take one request (reading the tokens bucket); raise the 429 if short."""
        await self._charge(principal, state, {Resource.REQUESTS: 1, Resource.TOKENS: 0})

    async def charge_tokens(self, principal: Principal, state: MutableMapping[str, Any], tokens: int) -> None:
        """Take ``tokens`` tokens (reading the requests bucket); raise the 429 if short."""
        await self._charge(principal, state, {Resource.REQUESTS: 0, Resource.TOKENS: tokens})

    async def _charge(
        self, principal: Principal, state: MutableMapping[str, Any], costs: dict[Resource, int]
    ) -> None:
        """Take ``costs`` all or nothing; the outcome goes to ``state`` (scope state) for the headers."""
        limits = {Resource.REQUESTS: principal.limits.rpm, Resource.TOKENS: principal.limits.tpm}
        takes = {
            resource: Take(keys.rate_bucket(principal.key_id, resource), limit, costs[resource])
            for resource, limit in limits.items()
            if limit is not None
        }
        if not takes:
            return
        states = dict(zip(takes, await self._buckets.take(list(takes.values())), strict=True))
        state.setdefault(_STATE_KEY, {}).update(states)
        for resource, bucket in states.items():
            if bucket.is_short:
                raise refusal(resource, bucket, costs[resource])


def refusal(resource: Resource, bucket: BucketState, cost: int) -> RateLimited:
    """OpenAI's 429 for ``resource``, with a Retry-After of whole seconds (at least 1)."""
    unit = _UNITS[resource]
    if not bucket.can_ever_fit:
        message = f"Request too large: {unit} limit {bucket.limit}, requested {cost}."
        retry_after_s = keys.RATE_WINDOW_S
    else:
        wait_s = bucket.retry_after_s or 0.0
        message = (
            f"Rate limit reached on {unit}: limit {bucket.limit}, remaining {bucket.remaining}, "
            f"requested {cost}. Please try again in {duration_text(wait_s)}."
        )
        retry_after_s = max(1, math.ceil(wait_s))
    return _REFUSALS[resource](message, retry_after_s=retry_after_s)


def rate_limit_headers(states: dict[Resource, BucketState]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for resource, bucket in states.items():
        headers[f"{_HEADER_PREFIX}limit-{resource}"] = str(bucket.limit)
        headers[f"{_HEADER_PREFIX}remaining-{resource}"] = str(bucket.remaining)
        headers[f"{_HEADER_PREFIX}reset-{resource}"] = duration_text(bucket.reset_s)
    return headers


def duration_text(seconds: float) -> str:
    """OpenAI's reset format: ``250ms`` under a second, else ``1.5s`` or ``6m0s``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class RateLimitHeadersMiddleware(HttpMiddleware):
    """Add the caller's latest bucket states as ``x-ratelimit-*`` headers to its response."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Handlers write into this very mapping (request.state), so it must exist first.
        state: dict[str, Any] = scope.setdefault("state", {})

        def add_headers(message: Message) -> None:
            if state.get(_STATE_KEY):
                headers = MutableHeaders(scope=message)
                for name, value in rate_limit_headers(state[_STATE_KEY]).items():
                    headers[name] = value

        await self.app(scope, receive, on_response_start(send, add_headers))
