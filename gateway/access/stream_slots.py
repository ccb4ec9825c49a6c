"""Owns the per-tenant cap on open streams: at most ``max_streams_per_tenant`` SSE streams at once, else 429.

Each open stream is a member of its tenant's sorted set (``keys.open_streams``),
named by the id of the HTTP request that opened it and scored by the time it
lapses: the longest any stream can live (the request timeout bounds every relay,
then the drain grace and the send timeout). A stream takes its slot before its
job is submitted, so a refusal costs no work, and gives it back when it ends,
however it ends: finished, failed, or its client gone (the response's own
teardown, ``gateway/http/sse.py``). A gateway that crashes gives nothing back;
its members lapse at their score, and every take first drops the lapsed, so a
dead gateway's streams stop counting on their own. The set itself expires with
its last member.

One script drops, counts and takes atomically, so gateways racing for a
tenant's last slot cannot both win. Intentional divergence: the anonymous caller
(no keys configured) is not capped, since without keys there is a single tenant
and nobody else to protect; the queue bound (``max_queued_requests``) still holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.access.auth import Principal
from shared import keys
from shared.errors import QuotaExceeded

logger = logging.getLogger(__name__)

_R = TypeVar("_R")
Release = Callable[[], Awaitable[None]]
# Giving a slot back is one ZREM; if Redis cannot take it in this long, the slot lapses instead.
_RELEASE_TIMEOUT_S = 2.0

# KEYS[1] the tenant's set; ARGV: now, this stream's lapse time, its id, the cap.
# Returns -1 when taken, else the number of streams open.
_TAKE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local open = redis.call('ZCARD', KEYS[1])
if open >= tonumber(ARGV[4]) then
    return open
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
local ttl = math.ceil(tonumber(ARGV[2]) - now)
if redis.call('TTL', KEYS[1]) < ttl then
    redis.call('EXPIRE', KEYS[1], ttl)
end
return -1
"""


class StreamSlots:
    """Open-stream slots of all tenants; one per gateway process."""

    def __init__(
        self, redis: Redis, max_streams: int, lifetime_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._redis = redis
        self._max_streams = max_streams
        self._lifetime_s = lifetime_s
        self._clock = clock
        self._take = redis.register_script(_TAKE)

    async def open(
        self, principal: Principal, stream_id: str, build: Callable[[Release], Awaitable[_R]]
    ) -> _R:
        """``build(release)``'s stream, holding one of the caller's slots (429 when none is free).

        ``build`` must hand ``release`` to the response that runs the stream; if it raises
        instead (a 4xx before any SSE byte), the slot is given back here.
        """
        if principal.is_anonymous:
            return await build(_nothing)
        await self._take_slot(principal.tenant, stream_id)
        release = self._releaser(principal.tenant, stream_id)
        try:
            return await build(release)
        except BaseException:
            await release()
            raise

    async def open_count(self, tenant: str) -> int:
        """The tenant's streams open now (lapsed ones not counted)."""
        return int(await self._redis.zcount(keys.open_streams(tenant), self._clock(), "+inf"))

    async def _take_slot(self, tenant: str, stream_id: str) -> None:
        now = self._clock()
        args: list[float | int | str] = [now, now + self._lifetime_s, stream_id, self._max_streams]
        open_now = int(await self._take(keys=[keys.open_streams(tenant)], args=args))
        if open_now >= 0:
            raise QuotaExceeded(
                f"This key's tenant has {open_now} streams open, the most this server allows at once "
                f"({self._max_streams}); retry once one of them ends.",
                retry_after_s=1,
            )

    def _releaser(self, tenant: str, stream_id: str) -> Release:
        async def release() -> None:
            # Runs in a response's teardown, often while it is being cancelled: shielded both ways
            # (anyio's for sse-starlette's cancel scopes, asyncio's for a plain Task.cancel).
            with anyio.move_on_after(_RELEASE_TIMEOUT_S, shield=True):
                try:
                    await asyncio.shield(self._redis.zrem(keys.open_streams(tenant), stream_id))
                except RedisError as error:
                    logger.warning("stream slot not given back (%s); it lapses at its deadline", error)

        return release


async def _nothing() -> None:
    return None
