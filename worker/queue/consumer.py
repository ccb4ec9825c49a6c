"""Owns the worker's queue loop: arq's ``Worker`` with the changes serving needs over arq's own.

arq is reached only through ``shared/jobs/arq_seam.py``, which lists the parts of
``Worker`` this subclass relies on and overrides.

1. **Wake-ups.** arq polls its queue every ``poll_delay``; each poll wakes the
   process, and on CPU every wake-up steals time from the model's threads, so a
   short delay costs compute and a long one adds up to a whole delay to every
   start and abort. Here the loop sleeps until a message or the poll delay,
   whichever comes first: the gateway publishes the job's lane on ``keys.wake(model)``
   after each enqueue and on ``keys.ABORTS_CHANNEL`` after each abort, and a job
   finishing here wakes its own lane and the lanes gated by the engine's room (its
   slot can take a waiting job). Jobs start and aborts land at once; the poll is
   only a safety net. arq reads its whole abort set at every poll; here only after an
   abort was announced, and at the safety-net polls (each read is a round trip), and
   only the entries written since the last read.
2. **Redis outages.** In arq a failed poll ends ``main()`` and with it the worker.
   Here it is logged and retried with backoff, so a worker rides out a Redis restart
   and goes on serving with no restart of its own.
3. **Graceful drain.** SIGTERM (or SIGINT) stops picking jobs, lets running jobs
   finish for up to ``drain_grace_s``, then shuts down; jobs still running then are
   cancelled, which hands them over to another worker (``worker/queue/jobs.py``). A second
   signal shuts down at once (with the same handover).
4. **One-trip polls.** A poll claims as many due jobs as it may start in one
   script, as arq claims them, instead of several round trips per job
   (``worker/queue/claims.py``, which documents why).
5. **Lanes.** One worker per lane queue: the interactive one takes every job it
   can; a batch-lane companion (same process, same engine) is gated by ``room``,
   which says how many batch jobs fit in the engine's spare capacity right now.
   The engine itself then admits and prefills interactive requests first.
``main`` repeats arq's start-up lines because its loop cannot be changed from outside.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from shared import keys
from shared.jobs.aborts import recent_aborts
from shared.jobs.arq_seam import Worker, create_pool, log_redis_info
from worker.queue.backoff import outage_delay
from worker.queue.claims import READ_WINDOW, claim_due_jobs

logger = logging.getLogger(__name__)


class QueueWorker(Worker):
    def __init__(
        self,
        *args: Any,
        wake_channel: str,
        lane: keys.Lane,
        drain_grace_s: float,
        drain_on_signals: bool,
        on_drain: Callable[[], None] = lambda: None,
        room: Callable[[], int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, handle_signals=False, **kwargs)
        self.queue_read_limit = READ_WINDOW
        self._picks = self.max_jobs  # how many new jobs this poll may start (``room`` for a gated lane)
        self._wake_channel = wake_channel
        self._lane = lane.value.encode()
        self._drain_grace_s = drain_grace_s
        self._drain_on_signals = drain_on_signals
        self._on_drain = on_drain
        self._room = room
        self.companions: list[QueueWorker] = []  # other lanes' workers, drained with this one
        self._leaders: list[QueueWorker] = []  # the worker this one is a companion of
        self._woken = asyncio.Event()
        # arq's abort set is read when an abort was announced since it was last read, and at
        # the safety-net polls: counters, so an announcement during a read is not lost.
        self._aborts_announced = 1
        self._aborts_read = 0
        self._aborts_read_at_ms = 0  # Redis's clock at the last read of the abort set
        self._draining = False
        self._stopping = False
        self._background: set[asyncio.Task[None]] = set()

    async def main(self) -> None:
        if self._pool is None:
            self._pool = await create_pool(
                self.redis_settings,
                job_deserializer=self.job_deserializer,
                job_serializer=self.job_serializer,
                default_queue_name=self.queue_name,
                expires_extra_ms=self.expires_extra_ms,
            )
        await log_redis_info(self.pool, logger.info)
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        if self._drain_on_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(signum, self.drain, signum)
        self._spawn(self._listen_for_wakeups())
        await self._poll_forever()

    def drain(self, signum: int = signal.SIGTERM) -> None:
        """Stop taking jobs; shut down once running ones finish or the grace period ends."""
        if self._draining:
            logger.warning("second %s: shutting down now", signal.Signals(signum).name)
            self._stop_main()
            return
        self._draining = True
        self.allow_pick_jobs = False
        for companion in self.companions:
            companion.stop_picking()
        logger.info(
            "%s: draining %d running jobs (grace %.0f s)",
            signal.Signals(signum).name,
            self._running_jobs(),
            self._drain_grace_s,
        )
        self._on_drain()
        self._spawn(self._finish_drain())

    async def close(self) -> None:
        """arq's close, except that a job task ending cancelled does not make it raise.

        arq cancels the running job tasks and gathers them without ``return_exceptions``:
        one cancelled before its own handler runs (just claimed, say) re-raised its
        CancelledError out of ``close``, and the worker's shutdown stopped half-way. Each
        such job is retried from its queue entry as any job of a stopped worker.
        """
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()  # done: arq's own close has nothing left to gather
        # The wake-up listener too: left running, it resubscribed on a pool arq's close had
        # dropped and ended in an AttributeError logged at shutdown.
        background = [task for task in self._background if task is not asyncio.current_task()]
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await super().close()

    def stop_picking(self) -> None:
        self._draining = True
        self.allow_pick_jobs = False

    async def _poll_forever(self) -> None:
        failures = 0
        while not self._stopping:
            self._gate()
            try:
                await self._poll_iteration()
                failures = 0
            except RedisError as error:
                delay = outage_delay(failures)
                failures += 1
                logger.warning("queue poll failed (%s); retrying in %.2f s", error, delay)
                await asyncio.sleep(delay)
                continue
            # asyncio.timeout, not wait_for: in Python 3.11 wait_for swallows a cancellation that
            # lands as the event fires, and a finishing job sets it at any moment.
            try:
                async with asyncio.timeout(self.poll_delay_s):
                    await self._woken.wait()
            except TimeoutError:
                self._aborts_announced += 1  # the safety net covers a missed announcement too
            self._woken.clear()

    async def _poll_iteration(self) -> None:
        """arq's poll with its start-up (``start_jobs``) done by one script; aborts and clean-up as arq's."""
        if self.allow_pick_jobs:
            wanted = min(self._picks, self.max_jobs - self.job_counter)
            if wanted > 0:
                await self._claim_and_start(wanted)
        if self.allow_abort_jobs and self._aborts_announced != self._aborts_read:
            announced = self._aborts_announced
            await self._cancel_aborted_jobs()
            self._aborts_read = announced
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # as arq: an error escaping run_job surfaces here
        await self.heart_beat()

    async def _claim_and_start(self, wanted: int) -> None:
        claimed = await claim_due_jobs(
            self.pool, self.queue_name, wanted, self.in_progress_timeout_s, self.queue_read_limit
        )
        for job_id, score in claimed:
            # arq's bookkeeping for a started job, as its start_jobs does it.
            await self.sem.acquire()
            self.job_counter += 1
            task = self.loop.create_task(self.run_job(job_id, score))
            task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
            task.add_done_callback(lambda _: self._slot_freed())
            self.tasks[job_id] = task

    async def _cancel_aborted_jobs(self) -> None:
        """arq's, reading only the abort entries written since the last read.

        arq reads the whole set at every poll, and its trim removes nothing (it drops scores
        above now + max age); the writer (``jobqueue.abort``) trims old entries instead. An
        entry for a job that is not running here yet is consumed when it starts (arq's
        ``run_job``), and the cancellation flag refuses it anyway.
        """
        self._aborts_read_at_ms, job_ids = await recent_aborts(self.pool, self._aborts_read_at_ms)
        aborted = {job_id for job_id in job_ids if job_id in self.job_tasks}
        for job_id in aborted:
            self.job_tasks[job_id].cancel()
        if aborted:
            self.aborting_tasks.update(aborted)
            await self.pool.zrem(keys.ARQ_ABORTS, *aborted)

    def add_companion(self, companion: QueueWorker) -> None:
        """Another lane's worker in this process: drained with this one, nudged with it."""
        self.companions.append(companion)
        companion._leaders.append(self)

    def share_with_jobs(self, **entries: object) -> None:
        """Add ``entries`` to the ctx of every job run here (arq merges its ``ctx`` into each job's)."""
        self.ctx.update(entries)

    def is_aborting(self, job_id: str) -> bool:
        """Whether a client's abort is cancelling ``job_id`` here (arq's ``aborting_tasks``)."""
        return job_id in self.aborting_tasks

    def nudge(self) -> None:
        """Poll now (something this lane's ``room`` depends on changed)."""
        self._woken.set()

    def _slot_freed(self) -> None:
        """A job here finished: poll now, here and in every lane gated by the engine's room.

        Not in an ungated lane of another kind: its own slots did not change, and each
        poll is a round trip on the event loop the engine's steps are published from.
        """
        for worker in (self, *self.companions, *self._leaders):
            if worker is self or worker._room is not None:
                worker._woken.set()

    async def _listen_for_wakeups(self) -> None:
        failures = 0
        while True:
            try:
                async with self.pool.pubsub() as pubsub:
                    await pubsub.subscribe(self._wake_channel, keys.ABORTS_CHANNEL)
                    failures = 0
                    async for message in pubsub.listen():
                        if message.get("type") != "message":
                            continue
                        if _is_abort(message):
                            self._aborts_announced += 1
                            self._woken.set()
                        elif message.get("data") in (self._lane, self._lane.decode()):
                            self._woken.set()
            except RedisError as error:
                delay = outage_delay(failures)
                failures += 1
                logger.debug("wake-up subscription lost (%s); resubscribing in %.2f s", error, delay)
                await asyncio.sleep(delay)

    async def _finish_drain(self) -> None:
        running = [
            task for worker in (self, *self.companions) for task in worker.tasks.values() if not task.done()
        ]
        if running:
            await asyncio.wait(running, timeout=self._drain_grace_s)
        left = self._running_jobs()
        logger.info("drain over: %s", f"handing over {left} jobs" if left else "all jobs finished")
        self._stop_main()

    def _gate(self) -> None:
        if self._room is None or self._draining:
            return
        room = self._room()
        self.allow_pick_jobs = room > 0
        self._picks = max(0, room)

    def _running_jobs(self) -> int:
        workers = [self, *self.companions]
        return sum(not task.done() for worker in workers for task in worker.tasks.values())

    def _stop_main(self) -> None:
        self._stopping = True
        self._woken.set()
        for task in self._background:
            if task is not asyncio.current_task():
                task.cancel()
        if self.main_task is not None:
            self.main_task.cancel()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _is_abort(message: dict[str, Any]) -> bool:
    return message.get("channel") in (keys.ABORTS_CHANNEL, keys.ABORTS_CHANNEL.encode())
