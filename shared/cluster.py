"""Owns the read-only view of the cluster in Redis: live workers with their load, and queue depths.

Both the gateway's ``/metrics`` (queue depth per model and lane) and
``tokenferry status`` read the cluster through here, so they agree on what a
"queue depth" is.

Intentional divergence: a queue's depth is the ``ZCARD`` of its arq queue, which
counts jobs not yet finished, running ones included: arq keeps a job in its
queue until the job ends and marks it running with a separate key. Telling the
two apart would cost one round trip per queued job at every scrape; the jobs
running on live workers are reported beside it (``WorkerLoad.running``), so the
waiting part is the difference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from shared import keys, registry


class QueueDepth(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    lane: keys.Lane
    jobs: int


class ClusterSnapshot(BaseModel):
    """What Redis says about the cluster at ``taken_at`` (seconds since the epoch)."""

    model_config = ConfigDict(frozen=True)

    taken_at: float
    workers: list[registry.WorkerInfo]
    queues: list[QueueDepth]


async def served_models(redis: Redis) -> list[str]:
    """Models with a live worker or served within ``keys.KNOWN_TTL_S``, sorted."""
    known: list[bytes] = await redis.hkeys(keys.known_models())  # type: ignore[misc]
    return sorted({name.decode() if isinstance(name, bytes) else name for name in known})


async def queue_depths(redis: Redis, models: list[str]) -> list[QueueDepth]:
    """The depth of every lane of every model in ``models``, read in one round trip."""
    lanes = [(model, lane) for model in models for lane in keys.Lane]
    if not lanes:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for model, lane in lanes:
            pipe.zcard(keys.queue(model, lane))
        counts: list[int] = await pipe.execute()
    return [
        QueueDepth(model=model, lane=lane, jobs=count)
        for (model, lane), count in zip(lanes, counts, strict=True)
    ]


def merged(snapshots: Sequence[ClusterSnapshot]) -> ClusterSnapshot:
    """One snapshot of several Redis servers (the home one and the model groups')."""
    if len(snapshots) == 1:
        return snapshots[0]
    lanes = list(keys.Lane)
    workers = [worker for snapshot in snapshots for worker in snapshot.workers]
    return ClusterSnapshot(
        taken_at=min(snapshot.taken_at for snapshot in snapshots),
        workers=sorted(workers, key=lambda worker: (worker.model, worker.worker_id)),
        queues=sorted(
            (queue for snapshot in snapshots for queue in snapshot.queues),
            key=lambda queue: (queue.model, lanes.index(queue.lane)),
        ),
    )


async def read_snapshot(redis: Redis) -> ClusterSnapshot:
    workers = await registry.live_workers(redis)
    models = sorted(set(await served_models(redis)) | {worker.model for worker in workers})
    return ClusterSnapshot(
        taken_at=time.time(),
        workers=sorted(workers, key=lambda worker: (worker.model, worker.worker_id)),
        queues=await queue_depths(redis, models),
    )
