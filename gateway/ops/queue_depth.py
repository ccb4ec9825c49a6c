"""Owns the ``tokenferry_queue_depth`` gauge: one gateway at a time exports it, under a Redis lease.

The depth of a model's queue lane is a fact about Redis, not about the gateway
that reads it. Exported by every gateway, ``sum(tokenferry_queue_depth)`` counted
each job once per gateway. So a gateway exports it only while it holds a short
lease (``keys.queue_depth_lease()``, ``SET NX PX`` with its own token), taken or
renewed at each of its scrapes; the others leave the gauge out of theirs. Sums
across gateways are right, and a model without any live worker (the backlog an
alert must see) is still reported, which exporting it from workers would not do.

The lease outlives a scrape interval (``QUEUE_DEPTH_LEASE_S``, above Prometheus'
1-minute default), so the holder keeps it from one scrape to the next. When the
holder dies, its lease lapses and the next gateway scraped takes it over; until
then no gateway exports the gauge (a gap of at most the lease, never a double).
A gateway that stops cleanly gives its lease back (``release``), so the next one
scraped takes over at once. The lease is in the home Redis; with model groups the
depths are read from every group's Redis (``group_redis``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge
from redis.asyncio import Redis

from shared import cluster, keys

logger = logging.getLogger(__name__)

# Longer than any usual scrape interval (Prometheus' default is 1 minute): a shorter lease
# would lapse between the holder's scrapes and let a second gateway export beside it.
QUEUE_DEPTH_LEASE_S = 90

# KEYS[1]: the lease; ARGV: the gateway's token, the TTL in ms. 1 when the caller holds it now.
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# KEYS[1]: the lease; ARGV[1]: the gateway's token. Deletes the lease only if the caller holds it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class QueueDepthExport:
    """The queue depth gauge of one gateway's registry, filled only while this gateway holds the lease."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.gauge = Gauge(
            "queue_depth",
            "Jobs in a model's queue lane not yet finished (waiting or running), read from Redis; "
            "exported by one gateway at a time.",
            ["model", "lane"],
            namespace="tokenferry",
            registry=registry,
        )
        self.token = secrets.token_hex(8)

    async def refresh(self, redis: Redis, group_redis: Sequence[Redis] = ()) -> None:
        """Take or renew the lease and read every queue's depth (in ``group_redis``, default
        ``redis``); without the lease, export none."""
        hold = redis.register_script(_HOLD)  # EVALSHA: the script's text is not sent per scrape
        held = await hold([keys.queue_depth_lease()], [self.token, QUEUE_DEPTH_LEASE_S * 1000])
        depths = []
        for holder in (group_redis or [redis]) if held else []:
            depths += await cluster.queue_depths(holder, await cluster.served_models(holder))
        self.gauge.clear()  # models no longer served, or a lease lost, must not linger
        for depth in depths:
            self.gauge.labels(depth.model, depth.lane.value).set(depth.jobs)

    def clear(self) -> None:
        self.gauge.clear()

    async def release(self, redis: Redis) -> None:
        """Give the lease back if this gateway holds it (a clean stop)."""
        await redis.register_script(_RELEASE)([keys.queue_depth_lease()], [self.token])
