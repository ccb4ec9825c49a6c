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

The runner's event loop must stay free for the renewals: drivers do long CPU work
(checking a batch's input file) on threads, a piece at a time, so a lease renewed
every third of its life outlives any of it.

A driver that raises because Redis is away (restarted under it, say) is logged and
its lease given back; the next poll claims the item again, so an outage delays
work but never drops it. Any other exception counts as a failure of the item,
kept in Redis (``keys.runner_failures``) so that every gateway sees the same
count: the runner keeps the lease through a backoff that doubles with each
failure (no runner claims the item meanwhile), and after ``max_failures`` in a
row it calls the kind's ``give_up`` (a batch ends ``failed`` saying so, or
``cancelled`` if a cancel was asked) instead of trying again. A driver that
returns clears the count. A kind with no ``give_up`` is tried again at the
longest backoff.
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
# Called with the item and its count of failures in a row, once the runner stops trying it.
GiveUp = Callable[[str, int], Coroutine[Any, Any, None]]

MAX_FAILURES = 5
FIRST_BACKOFF_S = 0.5
LONGEST_BACKOFF_S = 60.0
# Exceptions that say Redis is away, not that the item is bad: never counted as its failures.
_OUTAGES = (RedisError, OSError, TimeoutError)

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
        give_ups: Mapping[str, GiveUp] | None = None,
        poll_s: float = 0.5,
        lease_s: float = keys.RUNNER_LEASE_S,
        max_failures: int = MAX_FAILURES,
        first_backoff_s: float = FIRST_BACKOFF_S,
    ) -> None:
        self._redis = redis
        self._drivers = dict(drivers)
        self._give_ups = dict(give_ups or {})
        self._max_failures = max_failures
        self._first_backoff_ms = int(first_backoff_s * 1000)
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
        hold_ms = 0  # how long the lease outlives the drive: 0 gives it back, more is a backoff
        try:
            while not work.done():
                await asyncio.wait([work], timeout=self._lease_ms / 3000)
                if not work.done() and not await self._renew_lease(lease, self._lease_ms):
                    logger.warning("runner lost the lease of %s %s; another gateway drives it", kind, item)
                    return
            hold_ms = await self._settle(kind, item, work.exception())
        finally:
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            with contextlib.suppress(RedisError):
                await asyncio.shield(self._renew_lease(lease, hold_ms))
            self._tasks.pop((kind, item), None)

    async def _settle(self, kind: str, item: str, error: BaseException | None) -> int:
        """Count a drive's outcome; how long to hold the item's lease before it is tried again."""
        failures_key = keys.runner_failures(kind, item)
        try:
            if error is None:
                await self._redis.delete(failures_key)
                return 0
            if isinstance(error, _OUTAGES):
                logger.warning("runner could not drive %s %s: %s", kind, item, error)
                return 0
            failures = int(await self._redis.incr(failures_key))
            await self._redis.expire(failures_key, keys.RUNNER_FAILURES_TTL_S)
        except RedisError as outage:
            logger.warning("runner could not record how %s %s went: %s", kind, item, outage)
            return 0
        logger.error("runner failed on %s %s (%d in a row)", kind, item, failures, exc_info=error)
        give_up = self._give_ups.get(kind)
        if failures < self._max_failures or give_up is None:
            doubled = self._first_backoff_ms << min(failures - 1, 20)
            return min(doubled, int(LONGEST_BACKOFF_S * 1000))
        return await self._give_up(give_up, kind, item, failures)

    async def _give_up(self, give_up: GiveUp, kind: str, item: str, failures: int) -> int:
        try:
            await give_up(item, failures)
        except Exception:
            logger.exception("runner could not give up on %s %s; it tries again", kind, item)
            return int(LONGEST_BACKOFF_S * 1000)
        with contextlib.suppress(RedisError):
            await self._redis.delete(keys.runner_failures(kind, item))
        return 0

    async def _renew_lease(self, lease: str, ttl_ms: int) -> bool:
        try:
            return bool(await self._renew(keys=[lease], args=[self._token, ttl_ms]))
        except RedisError as error:
            # Keep going through a short outage: the lease outlives it, or the next renewal says so.
            logger.warning("runner could not renew %s: %s", lease, error)
            return True
