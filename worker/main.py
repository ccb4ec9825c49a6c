"""Owns the worker process: its two queue consumers (lanes), whose start-up builds the runtime.

``build_worker(settings)`` returns the interactive lane's consumer. Running it opens
the queue pool, and its start-up hook builds the ``WorkerRuntime`` (``worker/runtime.py``),
which starts the batch lane's consumer beside it; its shut-down hook closes the runtime.
Tests call it with test settings (``engine="fake"``) exactly as the CLI does, and pass
``tuning`` where a test needs the step loop's trade-offs moved.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid
from collections.abc import Callable
from typing import Any, TypedDict

from shared import keys
from shared.codec import deserialize_arq_job, serialize_arq_job
from shared.jobs import jobqueue
from shared.jobs.arq_seam import RedisSettings, job_function, worker_hook
from shared.settings import WorkerSettings
from worker.driver.engine_driver import DEFAULT_TUNING, DriverTuning
from worker.queue.consumer import QueueWorker
from worker.queue.jobs import GENERATE_MAX_TRIES, generate, install_log_redaction, tokenize
from worker.runtime import WorkerRuntime, batch_slots, build_runtime

# A generation may legitimately run long; failover does not rely on arq's timeout.
JOB_TIMEOUT_S = 3600


class WorkerProcess:
    """The two lanes' consumers, and the runtime the interactive lane's start-up builds for both."""

    def __init__(self, settings: WorkerSettings, *, handle_signals: bool, tuning: DriverTuning) -> None:
        self._settings = settings
        self._tuning = tuning
        self._worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._runtime: WorkerRuntime | None = None  # built by the start-up hook
        self.interactive = self._interactive_lane(drain_on_signals=handle_signals)
        self.batch_lane = self._batch_lane()
        self.interactive.add_companion(self.batch_lane)  # drained with it

    def _interactive_lane(self, *, drain_on_signals: bool) -> QueueWorker:
        """Every job of the model's interactive queue, tokenize jobs included."""
        settings = self._settings
        return QueueWorker(
            functions=[
                job_function(generate, name=jobqueue.GENERATE_FUNCTION, max_tries=GENERATE_MAX_TRIES),
                job_function(tokenize, name=jobqueue.TOKENIZE_FUNCTION, max_tries=1),
            ],
            queue_name=keys.queue(settings.model_name),
            lane=keys.Lane.INTERACTIVE,
            on_startup=worker_hook(self._start),
            on_shutdown=worker_hook(self._stop),
            # Each running sequence holds an arq slot; a small margin keeps the batch full.
            max_jobs=settings.max_batch_size + max(2, settings.max_batch_size // 4),
            drain_on_signals=drain_on_signals,
            on_drain=self._drain,
            **_queue_options(settings),
        )

    def _batch_lane(self) -> QueueWorker:
        """The companion taking batch-lane jobs into the engine's spare capacity only."""
        settings = self._settings
        return QueueWorker(
            functions=[job_function(generate, name=jobqueue.GENERATE_FUNCTION, max_tries=GENERATE_MAX_TRIES)],
            queue_name=keys.queue(settings.model_name, keys.Lane.BATCH),
            lane=keys.Lane.BATCH,
            max_jobs=batch_slots(settings),
            drain_on_signals=False,  # the interactive lane's worker drains it
            room=self._batch_room,
            **_queue_options(settings),
        )

    async def _start(self) -> None:
        self._runtime = await build_runtime(
            self._settings, self._worker_id, self.interactive, self.batch_lane, self._tuning
        )

    async def _stop(self) -> None:
        if self._runtime is not None:  # else start-up failed before anything was built
            await self._runtime.close()

    def _drain(self) -> None:
        if self._runtime is not None:
            self._runtime.start_draining()

    def _batch_room(self) -> int:
        # The batch lane polls only once the runtime has started it.
        return 0 if self._runtime is None else self._runtime.batch_room()


def build_worker(
    settings: WorkerSettings, *, handle_signals: bool = True, tuning: DriverTuning = DEFAULT_TUNING
) -> QueueWorker:
    """The interactive lane's consumer: running it runs the whole worker."""
    install_log_redaction()
    return WorkerProcess(settings, handle_signals=handle_signals, tuning=tuning).interactive


class _QueueOptions(TypedDict):
    redis_settings: RedisSettings
    job_timeout: int
    keep_result: int
    allow_abort_jobs: bool
    job_serializer: Callable[[dict[str, Any]], bytes]
    job_deserializer: Callable[[bytes], dict[str, Any]]
    poll_delay: float
    wake_channel: str
    drain_grace_s: float


def _queue_options(settings: WorkerSettings) -> _QueueOptions:
    """What both lanes' consumers share: JSON jobs, no results kept, aborts on, our wake-ups."""
    return {
        "redis_settings": jobqueue.redis_settings(settings.model_redis_url),
        "job_timeout": JOB_TIMEOUT_S,
        "keep_result": 0,
        "allow_abort_jobs": True,
        "job_serializer": serialize_arq_job,
        "job_deserializer": deserialize_arq_job,
        "poll_delay": settings.poll_delay_s,
        "wake_channel": keys.wake(settings.model_name),
        "drain_grace_s": settings.drain_grace_s,
    }


def run_worker(settings: WorkerSettings) -> None:
    """Blocking entry point for ``tokenferry worker``, on uvloop as the gateway (not on Windows,
    which uvloop does not build for). The loop routes and publishes every step and starts every
    job; on asyncio's own loop, its selector was a quarter of the worker's CPU at c=1 (py-spy)."""
    if sys.platform != "win32":
        import uvloop

        asyncio.set_event_loop(uvloop.new_event_loop())  # arq's worker takes the current loop
    build_worker(settings).run()
