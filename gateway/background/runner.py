"""Owns driving accepted background work (batches, background responses) to its end, from any gateway.

Gateways are stateless and any of them may die, so work is not tied to the one
that accepted it. Unfinished work is listed in Redis (``keys.active(kind)``);
every gateway runs one ``Runner`` in its lifespan, which claims listed items with
a short lease (``SET NX PX``) and drives each claimed item with its kind's driver
while renewing the lease. A gateway that dies stops renewing: its leases lapse
within ``keys.RUNNER_LEASE_S`` and another gateway's runner claims the work and
continues it from what Redis holds (the drivers are written to resume, see
``gateway/batches/run.py``). A gateway that stops cleanly gives its leases back at
once.

A driver that raises (Redis restarted under it, say) is logged and its lease
given back; the next poll claims the item again, so a transient failure delays
work but never drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import keys

logger = logging.getLogger(__name__)

Driver = Callable[[str], Coroutine[Any, Any, None]]

# KEYS[1]: a lease; ARGV: its holder's token, then the new TTL (ms, or 0 to release).
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""


class Runner:
    """Claims and drives work of several kinds; one per gateway process."""

    def __init__(
        self,
        redis: Redis,
        drivers: Mapping[str, Driver],
        *,
        poll_s: float = 0.5,
        lease_s: float = keys.RUNNER_LEASE_S,
    ) -> None:
        self._redis = redis
        self._drivers = dict(drivers)
        self._poll_s = poll_s
        self._lease_ms = int(lease_s * 1000)
        self._token = secrets.token_hex(8)
        self._renew = redis.register_script(_RENEW)
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Claim and drive work until cancelled; then stop every driver and give its lease back."""
        try:
            while True:
                try:
                    await self._claim_new()
                except RedisError as error:
                    logger.warning("runner could not look for work: %s", error)
                await asyncio.sleep(self._poll_s)
        finally:
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)

    async def _claim_new(self) -> None:
        for kind in self._drivers:
            for raw in await self._redis.smembers(keys.active(kind)):  # type: ignore[misc]
                item = raw.decode() if isinstance(raw, bytes) else str(raw)
                if (kind, item) in self._tasks:
                    continue
                lease = keys.runner_lease(kind, item)
                if await self._redis.set(lease, self._token, nx=True, px=self._lease_ms):
                    logger.info("runner claimed %s %s", kind, item)
                    self._tasks[(kind, item)] = asyncio.create_task(self._drive(kind, item))

    async def _drive(self, kind: str, item: str) -> None:
        lease = keys.runner_lease(kind, item)
        work: asyncio.Task[None] = asyncio.create_task(self._drivers[kind](item))
        try:
            while not work.done():
                await asyncio.wait([work], timeout=self._lease_ms / 3000)
                if not work.done() and not await self._renew_lease(lease, self._lease_ms):
                    logger.warning("runner lost the lease of %s %s; another gateway drives it", kind, item)
                    return
            if work.exception() is not None:
                logger.error("runner failed on %s %s", kind, item, exc_info=work.exception())
        finally:
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            with contextlib.suppress(RedisError):
                await asyncio.shield(self._renew_lease(lease, 0))
            self._tasks.pop((kind, item), None)

    async def _renew_lease(self, lease: str, ttl_ms: int) -> bool:
        try:
            return bool(await self._renew(keys=[lease], args=[self._token, ttl_ms]))
        except RedisError as error:
            # Keep going through a short outage: the lease outlives it, or the next renewal says so.
            logger.warning("runner could not renew %s: %s", lease, error)
            return True
