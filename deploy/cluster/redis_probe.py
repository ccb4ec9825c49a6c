"""Owns the supervisor's two questions to Redis: does it answer, and how many workers are live.

Synchronous wrappers over ``shared.registry`` (the supervisor is a plain blocking
loop); Redis errors become ``OSError`` so the wait loop treats them as "not yet".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import registry

_TIMEOUT_S = 2.0
T = TypeVar("T")


def ping(redis_url: str) -> bool:
    async def answer(client: Redis) -> bool:
        return bool(await client.ping())

    return _ask(redis_url, answer)


def live_worker_count(redis_url: str) -> int:
    async def count(client: Redis) -> int:
        return len(await registry.live_workers(client))

    return _ask(redis_url, count)


def _ask(redis_url: str, question: Callable[[Redis], Awaitable[T]]) -> T:
    async def asked() -> T:
        client = Redis.from_url(redis_url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S)
        try:
            return await question(client)
        finally:
            await client.aclose()

    try:
        return asyncio.run(asked())
    except RedisError as error:
        raise OSError(f"Redis at {redis_url}: {error}") from error
