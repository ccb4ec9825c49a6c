"""Owns the worker's presence in the registry: its heartbeat, which is also the lease on its jobs.

The heartbeat runs only while the engine loop runs: a worker that cannot
generate must not look live, or its jobs would never be taken over. A draining
worker keeps its heartbeat (its jobs are still its own) but says it is draining,
so gateways stop counting it as capacity for new requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import registry

logger = logging.getLogger(__name__)


class Presence:
    def __init__(
        self, redis: Redis, info: registry.WorkerInfo, load: Callable[[], registry.WorkerLoad]
    ) -> None:
        self._redis = redis
        self._info = info
        self._load = load

    @property
    def info(self) -> registry.WorkerInfo:
        return self._info

    async def announce(self) -> None:
        await registry.heartbeat(self._redis, self._info.model_copy(update={"load": self._load()}))

    async def start_draining(self) -> None:
        self._info = self._info.model_copy(update={"draining": True})
        with contextlib.suppress(RedisError):
            await self.announce()

    async def heartbeat_while_alive(self, interval_s: float, driver_task: asyncio.Task[None]) -> None:
        while not driver_task.done():
            await asyncio.sleep(interval_s)
            try:
                await self.announce()
            except RedisError as error:
                logger.warning("heartbeat failed: %s", error)
        if not driver_task.cancelled() and driver_task.exception() is not None:
            logger.critical("the engine loop died; deregistering", exc_info=driver_task.exception())
        await self.withdraw()

    async def withdraw(self) -> None:
        with contextlib.suppress(RedisError):
            await registry.deregister(self._redis, self._info.worker_id)
