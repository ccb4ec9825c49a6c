"""Owns per-minute token buckets in Redis (``keys.rate_bucket``), taken atomically by one Lua script.

A bucket holds up to ``limit`` units and refills continuously at ``limit`` per
minute; a request takes ``cost`` units or is refused. Unlike a fixed window this
never lets two full minutes' worth through at a window edge, and unlike a sliding log it
is two fields per bucket whatever the rate. ``remaining`` and ``reset`` (time
until the bucket is full again) are exactly what OpenAI's ``x-ratelimit-*``
headers report.

Why Lua: the read-refill-decide-write cycle must be atomic across every gateway
replica, and several buckets (requests and tokens) must be taken all or nothing:
a request refused for tokens must not spend a request, nor the other way round.
The script reads the clock with Redis ``TIME``, so gateways with skewed clocks
still agree. An untouched bucket expires after one window, when it would be full
anyway, so idle keys cost no memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from shared import keys

WINDOW_MS = keys.RATE_WINDOW_S * 1000
NEVER = -1  # a cost larger than the bucket itself can never be taken

# KEYS: the buckets. ARGV: window_ms, then (limit, cost) per bucket.
# Returns, per bucket: remaining (floor), reset_ms, retry_ms (0: enough; -1: never).
_TAKE_LUA = """
local window = tonumber(ARGV[1])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local levels, retries, is_allowed = {}, {}, true
for i = 1, #KEYS do
  local limit, cost = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local rate = limit / window
  local saved = redis.call('HMGET', KEYS[i], 'level', 'ts')
  local level, ts = tonumber(saved[1]), tonumber(saved[2])
  if level == nil or ts == nil then level, ts = limit, now end
  level = math.min(limit, level + math.max(0, now - ts) * rate)
  levels[i], retries[i] = level, 0
  if cost > limit then
    retries[i], is_allowed = -1, false
  elseif cost > level then
    retries[i], is_allowed = math.ceil((cost - level) / rate), false
  end
end
local out = {}
for i = 1, #KEYS do
  local limit, cost = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local level = levels[i]
  if is_allowed then level = level - cost end
  redis.call('HSET', KEYS[i], 'level', tostring(level), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[i], window)
  out[#out + 1] = math.floor(level)
  out[#out + 1] = math.ceil((limit - level) * window / limit)
  out[#out + 1] = retries[i]
end
return out
"""


@dataclass(frozen=True, slots=True)
class Take:
    """Ask ``bucket`` for ``cost`` units out of ``limit`` per minute (cost 0 only reads it)."""

    bucket: str
    limit: int
    cost: int


@dataclass(frozen=True, slots=True)
class BucketState:
    """One bucket right after a take; ``retry_after_s`` is None when it had enough."""

    limit: int
    remaining: int
    reset_s: float
    retry_after_s: float | None

    @property
    def is_short(self) -> bool:
        return self.retry_after_s is not None

    @property
    def can_ever_fit(self) -> bool:
        return self.retry_after_s is None or math.isfinite(self.retry_after_s)


class TokenBuckets:
    """The script bound to one Redis client; one per gateway process."""

    def __init__(self, redis: Redis) -> None:
        # register_script runs EVALSHA and loads the script on a NOSCRIPT reply.
        self._take = redis.register_script(_TAKE_LUA)

    async def take(self, takes: Sequence[Take]) -> list[BucketState]:
        """Take every cost or none (all-or-nothing); the states say which were short."""
        if not takes:
            return []
        args: list[int] = [WINDOW_MS]
        for take in takes:
            args += [take.limit, take.cost]
        reply = await self._take(keys=[take.bucket for take in takes], args=args)
        return [_state(take.limit, reply[3 * i : 3 * i + 3]) for i, take in enumerate(takes)]


def _state(limit: int, values: Sequence[int]) -> BucketState:
    remaining, reset_ms, retry_ms = (int(value) for value in values)
    retry_after_s = None if retry_ms == 0 else math.inf if retry_ms == NEVER else retry_ms / 1000
    return BucketState(
        limit=limit, remaining=max(0, remaining), reset_s=reset_ms / 1000, retry_after_s=retry_after_s
    )
