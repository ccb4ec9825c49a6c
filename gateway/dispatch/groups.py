"""Owns the gateway's connections to the model groups: one pool per group's Redis, and a model's.

A model's jobs, event streams, aborts, replies and workers live in its group's Redis
(``shared/redis_groups.py``; which keys, ``shared/keys.py``'s ``SIDES``); tenants' records
stay in the home Redis, the lifespan's own pool. The lifespan opens one more pool per
other group URL, with the home pool's limits (so ``--redis-max-connections`` is per
Redis), and everything routed by model asks ``for_model``. Without ``--redis-groups``
there is one pool, the home one, and every model gets it: nothing changes.

The registry is read from every group and joined (``live_workers``), so ``/v1/models``
lists every group's models. A group whose Redis fails there is left out of the list
(its models look unserved, as they are, while it is down) rather than failing the
whole list; only the home Redis failing fails it, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from redis.exceptions import RedisError

from shared import registry
from shared.jobs.arq_seam import QueuePool
from shared.redis_groups import RedisGroups
from shared.redis_url import redacted_url

logger = logging.getLogger(__name__)

# The key of the only pool of a gateway without groups (``GroupPools.single``).
_ONLY = "redis://home"


class GroupPools:
    """The home pool and one pool per other model group; ``for_model`` picks a model's."""

    def __init__(self, groups: RedisGroups, pools: Mapping[str, QueuePool]) -> None:
        missing = set(groups.urls()) - pools.keys()
        if missing:
            raise ValueError(f"no pool for the groups at {sorted(map(redacted_url, missing))}")
        self._groups = groups
        self._pools = dict(pools)

    @classmethod
    def single(cls, pool: QueuePool) -> GroupPools:
        """Every model on ``pool``: a gateway with one Redis (and tests around one)."""
        return cls(RedisGroups(home_url=_ONLY, exact={}, globs=()), {_ONLY: pool})

    @classmethod
    async def open(
        cls, groups: RedisGroups, home: QueuePool, open_pool: Callable[[str], Awaitable[QueuePool]]
    ) -> GroupPools:
        """``home`` plus a pool opened by ``open_pool`` for each other group URL (all or none)."""
        pools = {groups.home_url: home}
        try:
            for url in groups.urls():
                if url not in pools:
                    pools[url] = await open_pool(url)
        except BaseException:
            for url, pool in pools.items():
                if url != groups.home_url:
                    await pool.aclose()
            raise
        return cls(groups, pools)

    @property
    def home(self) -> QueuePool:
        """The home Redis: API keys, tenants, files, batches, stored responses, stream views."""
        return self._pools[self._groups.home_url]

    def url_for(self, model: str) -> str:
        """Which group ``model`` is in, as its URL (a key of ``by_url``)."""
        return self._groups.url_for(model)

    def for_model(self, model: str) -> QueuePool:
        """The pool of ``model``'s group (a model's name or an alias: both lead to one group)."""
        return self._pools[self._groups.url_for(model)]

    def by_url(self) -> Mapping[str, QueuePool]:
        """Every pool, by its group's URL, the home one first."""
        return self._pools

    async def live_workers(self) -> list[registry.WorkerInfo]:
        """The live workers of every group: what the gateway serves."""
        found = await asyncio.gather(
            *(registry.live_workers(pool) for pool in self._pools.values()), return_exceptions=True
        )
        workers: list[registry.WorkerInfo] = []
        for url, result in zip(self._pools, found, strict=True):
            if isinstance(result, BaseException):
                if url == self._groups.home_url or not isinstance(result, RedisError | OSError):
                    raise result
                logger.warning("model group at %s unreadable: %s", redacted_url(url), result)
                continue
            workers.extend(result)
        return workers

    async def aclose(self) -> None:
        """Close the groups' pools; the home pool is its opener's to close."""
        for url, pool in self._pools.items():
            if url != self._groups.home_url:
                await pool.aclose()
