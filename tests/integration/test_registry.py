"""Live-worker lookups: expired records are skipped and pruned from the index."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from shared import keys, registry


def _info(worker_id: str, model: str = "m") -> registry.WorkerInfo:
    return registry.WorkerInfo(worker_id=worker_id, model=model, max_model_len=128, started_at=time.time())


async def test_live_workers_skips_and_prunes_expired_records(redis: Redis) -> None:
    await registry.heartbeat(redis, _info("alive"))
    await registry.heartbeat(redis, _info("gone"))
    await redis.delete(keys.worker("gone"))  # its heartbeat's TTL ran out
    assert [info.worker_id for info in await registry.live_workers(redis)] == ["alive"]
    assert await redis.smembers(keys.workers_index()) == {b"alive"}  # type: ignore[misc]
    availability, info = await registry.model_availability(redis, "m")
    assert availability is registry.ModelAvailability.LIVE and info is not None


async def test_no_workers_at_all(redis: Redis) -> None:
    assert await registry.live_workers(redis) == []
    availability, _ = await registry.model_availability(redis, "never-served")
    assert availability is registry.ModelAvailability.UNKNOWN


async def test_an_alias_of_a_model_whose_workers_are_gone_is_known(redis: Redis) -> None:
    await registry.heartbeat(redis, _info("w", "primary").model_copy(update={"aliases": ("alias",)}))
    availability, info = await registry.model_availability(redis, "alias")
    assert availability is registry.ModelAvailability.LIVE and info is not None and info.model == "primary"

    await registry.deregister(redis, "w")

    availability, _ = await registry.model_availability(redis, "alias")
    assert availability is registry.ModelAvailability.KNOWN
