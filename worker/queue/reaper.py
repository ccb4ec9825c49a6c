"""Owns failover: finding jobs whose worker died and putting them back in the queue to be resumed.

A live worker of each model sweeps its run table every ``reap_interval_s``: the workers take
turns (``take_turn``: the first to ask in an interval), since one sweep finds what any would. A job
whose owner's heartbeat key has expired is moved to its next attempt with one
atomic script (``run_records.orphan``), so when several workers sweep at once exactly
one re-enqueues it; arq's records of the dead attempt are dropped so it neither
counts as queued nor runs again. A job past its deadline is ended with a clear
``failed`` event instead: its client has given up, or is about to.

A sweep decides in the Redis server which records need it (``run_records.reaping_candidates``,
``jobqueue.unclaimed_in_progress``): only those come back whole. Read in Python, every record's
job was parsed at every sweep, on the event loop that publishes the engine's tokens: a worker
serving 64 streams through vLLM's engine spent a quarter of its CPU there (py-spy), and a sweep
of 1,000 records took 34 ms of CPU, now 0.2 ms (2-core Xeon, real Redis).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from shared import keys, registry
from shared.errors import Timeout
from shared.jobs import jobqueue, run_records
from shared.jobs.arq_seam import QueuePool
from shared.jobs.streams import EventWriter
from shared.logs import request_context
from shared.protocol import Failed

logger = logging.getLogger(__name__)

# Far above a pick-to-claim gap (one Redis round trip), far below a client's patience.
UNCLAIMED_GRACE_S = 10.0


class Reaper:
    def __init__(
        self,
        pool: QueuePool,
        model: str,
        interval_s: float,
        on_failover: Callable[[], None] = lambda: None,
        worker_id: str = "",
    ) -> None:
        self._pool = pool
        self._model = model
        self._worker_id = worker_id
        self._interval_s = interval_s
        self._writer = EventWriter(pool)
        self._on_failover = on_failover
        self._unclaimed_since: dict[str, float] = {}  # arq job id -> first seen running unclaimed

    async def run(self) -> None:
        """Sweep forever, in the intervals this worker wins; a Redis outage only skips sweeps."""
        while True:
            try:
                if await self.take_turn():
                    await self.sweep()
                    await self.release_unclaimed()
            except RedisError as error:
                logger.warning("takeover sweep failed: %s", error)
            await asyncio.sleep(self._interval_s)

    async def take_turn(self) -> bool:
        """Whether this worker sweeps in this interval: the first of the model's workers to ask."""
        interval_ms = max(1, int(self._interval_s * 1000))
        turn = keys.sweep_turn(self._model)
        return bool(await self._pool.set(turn, self._worker_id, nx=True, px=interval_ms))

    async def sweep(self) -> int:
        """Re-enqueue the jobs of dead workers; returns how many were taken over."""
        now = time.time()
        records = await run_records.reaping_candidates(self._pool, self._model, now)
        if not records:
            return 0
        live = {info.worker_id for info in await registry.live_workers(self._pool)}
        taken = 0
        for record in records:
            if _needs_action(record, live, now):
                with request_context(record.request_id):
                    taken += await self._take_over(record, now)
        return taken

    async def _take_over(self, record: run_records.RunRecord, now: float) -> int:
        outcome = await run_records.orphan(self._pool, record, now)
        dead_attempt = keys.attempt_job_id(record.request_id, record.attempt)
        if outcome in (run_records.Orphaning.RACED, run_records.Orphaning.WAITING):
            return 0
        await jobqueue.forget(self._pool, self._model, dead_attempt)
        if outcome is run_records.Orphaning.EXPIRED:
            logger.warning("dropped: its deadline passed before it could be resumed")
            error = Timeout("the request's worker died and no worker could resume it before its deadline")
            await self._writer.publish_step([(record.request_id, Failed(error=error.to_info()))])
            return 0
        if outcome is run_records.Orphaning.CANCELLED:
            logger.info("dropped: cancelled by its client after its worker died")
            return 0
        attempt = record.attempt + 1
        logger.warning("worker of attempt %d is gone; re-enqueued as attempt %d", record.attempt, attempt)
        await jobqueue.enqueue(self._pool, record.job.model_copy(update={"attempt": attempt}))
        self._on_failover()
        return 1

    async def release_unclaimed(self, now: float | None = None) -> list[str]:
        """Give back to arq the jobs a worker picked but died before claiming (none of ours would wait).

        arq marks a job running when it is picked and, with ``max_tries=1``, would never
        run it again; a claim follows the pick within milliseconds, so a job seen
        running and unclaimed for ``UNCLAIMED_GRACE_S`` lost its worker before the claim.
        """
        now = time.monotonic() if now is None else now
        current = set(await jobqueue.unclaimed_in_progress(self._pool, self._model))
        self._unclaimed_since = {job_id: self._unclaimed_since.get(job_id, now) for job_id in current}
        stale = [
            job_id for job_id, since in self._unclaimed_since.items() if now - since >= UNCLAIMED_GRACE_S
        ]
        for job_id in stale:
            logger.warning("job %s was picked by a worker that died before claiming it; released", job_id)
            await jobqueue.release(self._pool, job_id)
            del self._unclaimed_since[job_id]
        return stale


def _needs_action(record: run_records.RunRecord, live: set[str], now: float) -> bool:
    if record.is_queued:
        deadline = record.job.deadline_at
        return deadline is not None and deadline < now  # waiting in the queue: only expiry concerns us
    return run_records.owner_worker(record.owner) not in live
