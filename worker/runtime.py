"""Owns the worker's typed composition: ``build_runtime`` builds every part of a running worker once.

The interactive lane's start-up (``worker/main.py``) calls it once arq has opened the
queue pool, before the first job is claimed. Every part is a typed field of the
``WorkerRuntime`` it returns, and the job handlers (``worker/queue/jobs.py``) receive
that runtime as the one entry of their ctx (``WorkerContext``). Two orders matter:
the metrics port is bound before the model loads (a busy port fails at once, and the
probes answer "loading" meanwhile), and the worker announces itself before its engine
loop and batch lane start (a claimed job always has a live owner). /ready turns 200
only once all of that is done (``worker/probes.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis

from shared import engines, keys, registry
from shared.jobs.arq_seam import QueuePool
from shared.jobs.streams import EventWriter
from shared.os_scheduling import batch_threads, worker_batches
from shared.redis_connect import async_client
from shared.settings import WorkerSettings
from worker.driver.engine_driver import DEFAULT_TUNING, DriverTuning, EngineDriver
from worker.driver.lifecycle import JobLifecycle, Preparer
from worker.metrics import MetricsServer, WorkerMetrics
from worker.model.backend import Backend, load_backend
from worker.model.compute_thread import compute_executor
from worker.model.freed_memory import return_freed_memory
from worker.model.warmup import warm_up
from worker.probes import Probes
from worker.queue.consumer import QueueWorker
from worker.queue.presence import Presence
from worker.queue.reaper import Reaper
from worker.requests.chat_options import ChatOptions
from worker.requests.limits import ModelLimits
from worker.requests.params import DefaultLayers, spec_from_generation_config
from worker.requests.preparation import prepare
from worker.requests.tokenize_replies import TokenizeService

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerRuntime:
    """One worker process's parts, built once by ``build_runtime`` and handed to every job."""

    settings: WorkerSettings
    worker_id: str
    pool: QueuePool  # the interactive lane's pool: claims, run records, handovers, replies
    redis: Redis  # events and presence
    backend: Backend
    metrics: WorkerMetrics
    metrics_server: MetricsServer | None
    probes: Probes
    writer: EventWriter
    lifecycle: JobLifecycle
    driver: EngineDriver
    tokenize_service: TokenizeService
    presence: Presence
    reaper: Reaper
    interactive: QueueWorker  # the consumer of the interactive lane, whose hooks own this runtime
    batch_lane: QueueWorker  # its companion on the batch lane, gated by ``batch_room``
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def is_aborting(self, job_id: str) -> bool:
        """Whether a client's abort is cancelling ``job_id`` (ids are unique across lanes)."""
        return self.interactive.is_aborting(job_id) or self.batch_lane.is_aborting(job_id)

    def batch_room(self) -> int:
        """How many batch-lane jobs fit in the engine's spare capacity right now."""
        if self.driver.is_starting_interactive:
            # Interactive first: starting a batch job costs this process round trips and
            # preparation work that an interactive request on its way to its first token
            # would wait behind; the lane is nudged once that token is out.
            return 0
        spare = self.settings.max_batch_size - self.driver.active_count
        return min(spare, batch_slots(self.settings) - self.driver.active_in_lane(keys.Lane.BATCH.value))

    def start(self) -> None:
        """Give both lanes' jobs this runtime; start the engine loop, heartbeat, reaper and batch lane."""
        self.interactive.share_with_jobs(runtime=self)
        self.batch_lane.share_with_jobs(runtime=self)
        driver_task = asyncio.create_task(self.driver.serve(), name="engine-driver")
        self.probes.serving(driver_task)
        heartbeat = self.presence.heartbeat_while_alive(self.settings.heartbeat_interval_s, driver_task)
        self.tasks.extend(
            [
                driver_task,
                asyncio.create_task(heartbeat, name="heartbeat"),
                asyncio.create_task(self.reaper.run(), name="reaper"),
                asyncio.create_task(self.batch_lane.async_run(), name="batch-lane"),
            ]
        )

    def start_draining(self) -> None:
        """Say in the registry and on /ready that this worker drains: nothing counts it as capacity."""
        self.probes.draining()
        self.tasks.append(asyncio.get_running_loop().create_task(self.presence.start_draining()))

    async def close(self) -> None:
        await self.batch_lane.close()  # its running jobs are handed over while the engine still runs
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.presence.withdraw()
        self.driver.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
        await self.redis.aclose()
        logger.info("worker %s stopped", self.worker_id)


def batch_slots(settings: WorkerSettings) -> int:
    """The batch lane's share of the engine's batch: how many batch jobs may run at once."""
    return max(1, int(settings.max_batch_size * settings.batch_share))


async def build_runtime(
    settings: WorkerSettings,
    worker_id: str,
    interactive: QueueWorker,
    batch_lane: QueueWorker,
    tuning: DriverTuning = DEFAULT_TUNING,
) -> WorkerRuntime:
    """Build the worker's parts around ``interactive``'s open pool, and start them."""
    started = time.monotonic()
    metrics = WorkerMetrics(settings.model_name)
    probes = Probes(worker_id)
    port = settings.metrics_port  # bound before the model loads: a busy port fails at once
    metrics_server = None if port is None else metrics.serve(port, settings.metrics_host, probes)
    backend = await asyncio.get_running_loop().run_in_executor(
        compute_executor(), _load_and_warm_up, settings, metrics.grammar_compile_seconds.observe
    )
    if worker_batches(settings.os_scheduling, settings.engine):  # after vLLM's engine core started
        logger.info("worker threads under SCHED_BATCH: %d", batch_threads())
    redis = async_client(settings.model_redis_url)
    writer = EventWriter(redis)
    pool = interactive.pool
    lifecycle = JobLifecycle(pool, writer, backend.tokenizer, _preparer(settings, backend), worker_id)
    driver = EngineDriver(
        backend.engine, lifecycle, writer, settings.model_name, metrics, settings.batch_hold_s, tuning
    )
    presence = Presence(redis, _worker_info(settings, worker_id, backend), metrics.sample_load)
    await presence.announce()  # live before the first claim: a claimed job always has a live owner
    driver.when_all_started(batch_lane.nudge)
    runtime = WorkerRuntime(
        settings=settings,
        worker_id=worker_id,
        pool=pool,
        redis=redis,
        backend=backend,
        metrics=metrics,
        metrics_server=metrics_server,
        probes=probes,
        writer=writer,
        lifecycle=lifecycle,
        driver=driver,
        tokenize_service=TokenizeService(
            backend.tokenizer,
            backend.max_model_len,
            backend.vocab_size,
            _chat_options(settings, backend).template_kwargs,
        ),
        presence=presence,
        reaper=Reaper(
            pool, settings.model_name, settings.reap_interval_s, metrics.record_failover, worker_id=worker_id
        ),
        interactive=interactive,
        batch_lane=batch_lane,
    )
    runtime.start()
    elapsed = time.monotonic() - started
    logger.info("worker %s serving %s, ready in %.1f s", worker_id, settings.model_name, elapsed)
    return runtime


def _load_and_warm_up(settings: WorkerSettings, on_grammar_compile: Callable[[float], None]) -> Backend:
    backend = load_backend(settings, on_grammar_compile)
    warm_up(backend)
    return_freed_memory()  # what the grammar tables' build and the first forward freed
    return backend


def _preparer(settings: WorkerSettings, backend: Backend) -> Preparer:
    """``prepare`` bound to the model's tokenizer, its sampling defaults and its limits."""
    defaults = DefaultLayers(
        settings.server_sampling_defaults(), spec_from_generation_config(backend.generation_config)
    )
    limits = ModelLimits(
        backend.max_model_len,
        backend.tokenizer.eos_token_ids,
        backend.vocab_size,
        # Beam search runs its beams as rows of one generate call: never more than a batch.
        max_num_beams=min(settings.max_num_beams, settings.max_batch_size),
        engine=settings.engine,
        engine_refuses=engines.refused_by(settings.engine),
    )
    return functools.partial(
        prepare,
        tokenizer=backend.tokenizer,
        defaults=defaults,
        limits=limits,
        chat=_chat_options(settings, backend),
        grammars=backend.grammars,
    )


def _chat_options(settings: WorkerSettings, backend: Backend) -> ChatOptions:
    return ChatOptions.of(settings, backend.tokenizer.chat_template_source)


def _worker_info(settings: WorkerSettings, worker_id: str, backend: Backend) -> registry.WorkerInfo:
    return registry.WorkerInfo(
        worker_id=worker_id,
        model=settings.model_name,
        aliases=settings.model_aliases,
        max_model_len=backend.max_model_len,
        started_at=time.time(),
        engine=settings.engine,
        refuses=engines.refused_by(settings.engine),
    )
