"""Owns the worker process's composition: builds the backend, driver, registration and arq worker.

``build_worker(settings)`` is the only place worker objects are wired together;
tests call it with test settings (``engine="fake"``) exactly as the CLI does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

from arq.worker import Worker, func
from redis.asyncio import Redis

from shared import keys, registry
from shared.codec import deserialize_arq_job, serialize_arq_job
from shared.jobs import jobqueue
from shared.jobs.streams import EventWriter
from shared.settings import WorkerSettings
from worker.driver.engine_driver import EngineDriver
from worker.driver.lifecycle import JobLifecycle
from worker.engine import Engine
from worker.metrics import MetricsServer, WorkerMetrics
from worker.queue.consumer import QueueWorker
from worker.queue.jobs import GENERATE_MAX_TRIES, WorkerContext, generate, install_log_redaction, tokenize
from worker.queue.presence import Presence
from worker.queue.reaper import Reaper
from worker.requests.params import DefaultLayers, ModelLimits, spec_from_generation_config
from worker.requests.preparation import admit
from worker.requests.tokenization import Tokenizer
from worker.requests.tokenize_replies import TokenizeService

logger = logging.getLogger(__name__)

# A generation may legitimately run long; failover does not rely on arq's timeout.
JOB_TIMEOUT_S = 3600


@dataclass
class Backend:
    engine: Engine
    tokenizer: Tokenizer
    generation_config: dict[str, Any]
    max_model_len: int
    vocab_size: int


@dataclass
class Runtime:
    redis: Redis
    driver: EngineDriver
    presence: Presence
    tasks: list[asyncio.Task[None]]
    metrics_server: MetricsServer | None = None
    batch_lane: QueueWorker | None = None


def load_backend(settings: WorkerSettings) -> Backend:
    """Build the engine and tokenizer named by the settings (blocking: call off the loop)."""
    if settings.engine == "fake":
        from worker.engine.fake import ByteTokenizer, FakeEngine

        engine = FakeEngine(
            settings.fake_script,
            step_delay_s=settings.fake_step_delay_s,
            max_batch_size=settings.max_batch_size,
        )
        return Backend(engine, ByteTokenizer(), {}, settings.max_model_len or 4096, vocab_size=257)
    return _load_transformers_backend(settings)


def _load_transformers_backend(settings: WorkerSettings) -> Backend:
    # Imported here so fake-engine workers (tests, load tests) never pay for torch.
    import torch

    from worker.model.loading import load_model
    from worker.model.onednn_linear import can_pack, pack_linear_layers
    from worker.requests.tokenization import HFTokenizer, load_chat_template

    loaded = load_model(settings)
    # torch's default is one thread per core. Leaving a core to the event loop, Redis and the
    # gateway used to pay while each queue poll cost the loop a round trip per running job;
    # since polls are cheap, all cores win (bench on 2 cores, 32 streams: 84 -> 117 tok/s).
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    if settings.onednn_linear and can_pack(loaded.model):
        pack_linear_layers(loaded.model)
    if settings.compile:
        loaded.model.forward = torch.compile(loaded.model.forward, **settings.compile_args.model_dump())
    template = load_chat_template(settings.chat_template) if settings.chat_template else None
    eos = loaded.generation_config.get("eos_token_id")
    extra_eos = [eos] if isinstance(eos, int) else list(eos or [])
    tokenizer = HFTokenizer(loaded.tokenizer, chat_template=template, extra_eos_ids=extra_eos)
    engine = _build_engine(loaded.model, settings)
    vocab_size = int(loaded.model.config.vocab_size)
    return Backend(engine, tokenizer, loaded.generation_config, loaded.max_model_len, vocab_size)


def _build_engine(model: Any, settings: WorkerSettings) -> Engine:
    """The batched engine, unless a cache option only the per-sequence engine honours is set."""
    from worker.engine.hf import TransformersEngine
    from worker.engine.kv_cache import PaddedKVCache
    from worker.engine.scheduler import BatchLimits
    from worker.engine.sequential import SequentialEngine

    if (
        settings.disable_kv_cache
        or settings.cache_implementation == "static"
        or not PaddedKVCache.supports(model.config)
    ):
        return SequentialEngine(
            model,
            max_batch_size=settings.max_batch_size,
            cache_implementation=settings.cache_implementation,
            use_cache=not settings.disable_kv_cache,
        )
    limits = BatchLimits(settings.max_batch_size, settings.max_batch_tokens, settings.max_prefill_tokens)
    return TransformersEngine(model, limits, prefix_cache_tokens=settings.prefix_cache_tokens)


def build_worker(settings: WorkerSettings, *, handle_signals: bool = True) -> Worker:
    worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    ctx: dict[str, Any] = {"settings": settings, "worker_id": worker_id}
    worker = QueueWorker(
        # arq types ctx as a plain dict; ours is the same dict seen through WorkerContext.
        functions=[
            func(cast(Any, generate), name=jobqueue.GENERATE_FUNCTION, max_tries=GENERATE_MAX_TRIES),
            func(cast(Any, tokenize), name=jobqueue.TOKENIZE_FUNCTION, max_tries=1),
        ],
        queue_name=keys.queue(settings.model_name),
        lane=keys.Lane.INTERACTIVE,
        on_startup=cast(Any, _startup),
        on_shutdown=cast(Any, _shutdown),
        ctx=ctx,
        # Each running sequence holds an arq slot; a small margin keeps the batch full.
        max_jobs=settings.max_batch_size + max(2, settings.max_batch_size // 4),
        poll_delay=settings.poll_delay_s,
        drain_on_signals=handle_signals,
        on_drain=lambda: _start_draining(ctx),
        **_queue_options(settings),
    )
    ctx["is_aborted"] = lambda job_id: job_id in worker.aborting_tasks
    ctx["queue_worker"] = worker  # batch-lane companions join its drain
    install_log_redaction()
    return worker


async def _startup(ctx: WorkerContext) -> None:
    settings = ctx["settings"]
    started = time.monotonic()
    metrics = WorkerMetrics()
    port = settings.metrics_port  # bound before the model loads: a busy port fails at once
    metrics_server = None if port is None else metrics.serve(port, settings.metrics_host)
    backend = await asyncio.to_thread(load_backend, settings)
    redis = Redis.from_url(settings.redis_url)
    writer = EventWriter(redis)
    defaults = DefaultLayers(
        settings.server_sampling_defaults(), spec_from_generation_config(backend.generation_config)
    )
    limits = ModelLimits(backend.max_model_len, backend.tokenizer.eos_token_ids, backend.vocab_size)
    admitter = functools.partial(admit, tokenizer=backend.tokenizer, defaults=defaults, limits=limits)
    pool = ctx["redis"]
    lifecycle = JobLifecycle(pool, writer, backend.tokenizer, admitter, ctx["worker_id"])
    driver = EngineDriver(
        backend.engine, lifecycle, writer, settings.model_name, metrics, batch_hold_s=settings.batch_hold_s
    )
    info = registry.WorkerInfo(
        worker_id=ctx["worker_id"],
        model=settings.model_name,
        max_model_len=backend.max_model_len,
        started_at=time.time(),
    )
    presence = Presence(redis, info, metrics.sample_load)
    await presence.announce()  # live before the first claim: a claimed job always has a live owner
    driver_task = asyncio.create_task(driver.serve(), name="engine-driver")
    heartbeat = presence.heartbeat_while_alive(settings.heartbeat_interval_s, driver_task)
    reaper = Reaper(pool, settings.model_name, settings.reap_interval_s, metrics.record_failover)
    tasks = [
        driver_task,
        asyncio.create_task(heartbeat, name="heartbeat"),
        asyncio.create_task(reaper.run(), name="reaper"),
    ]
    ctx["driver"] = driver
    ctx["tokenize_service"] = TokenizeService(backend.tokenizer, backend.max_model_len, backend.vocab_size)
    ctx["writer"] = writer
    batch_lane = _batch_lane_worker(ctx, settings, driver)
    tasks.append(asyncio.create_task(batch_lane.async_run(), name="batch-lane"))
    ctx["runtime"] = Runtime(redis, driver, presence, tasks, metrics_server, batch_lane)
    logger.info(
        "worker %s serving %s, ready in %.1f s", info.worker_id, info.model, time.monotonic() - started
    )


async def _shutdown(ctx: WorkerContext) -> None:
    runtime = ctx.get("runtime")
    if not isinstance(runtime, Runtime):
        return  # start-up failed before anything was built
    if runtime.batch_lane is not None:
        await runtime.batch_lane.close()  # its running jobs are handed over while the engine still runs
    for task in runtime.tasks:
        task.cancel()
    await asyncio.gather(*runtime.tasks, return_exceptions=True)
    await runtime.presence.withdraw()
    runtime.driver.close()
    if runtime.metrics_server is not None:
        runtime.metrics_server.close()
    await runtime.redis.aclose()
    logger.info("worker %s stopped", runtime.presence.info.worker_id)


def _batch_lane_worker(ctx: WorkerContext, settings: WorkerSettings, driver: EngineDriver) -> QueueWorker:
    """The companion taking batch-lane jobs into the engine's spare capacity only."""
    batch_slots = max(1, int(settings.max_batch_size * settings.batch_share))

    def room() -> int:
        if driver.starts:
            # Interactive first: starting a batch job costs this process round trips and
            # admission work that an interactive request on its way to its first token
            # would wait behind; the lane is nudged once that token is out.
            return 0
        spare = settings.max_batch_size - driver.active_count
        return min(spare, batch_slots - driver.active_in_lane(keys.Lane.BATCH.value))

    worker = QueueWorker(
        functions=[func(cast(Any, generate), name=jobqueue.GENERATE_FUNCTION, max_tries=GENERATE_MAX_TRIES)],
        queue_name=keys.queue(settings.model_name, keys.Lane.BATCH),
        lane=keys.Lane.BATCH,
        ctx=dict(ctx),
        max_jobs=batch_slots,
        poll_delay=settings.poll_delay_s,
        drain_on_signals=False,  # the interactive lane's worker drains it
        room=room,
        **_queue_options(settings),
    )
    worker.ctx["is_aborted"] = lambda job_id: job_id in worker.aborting_tasks
    driver.starts.when_all_started(worker.nudge)
    ctx_main = ctx.get("queue_worker")
    if isinstance(ctx_main, QueueWorker):
        ctx_main.add_companion(worker)
    return worker


def _queue_options(settings: WorkerSettings) -> dict[str, Any]:
    """What both lanes' arq workers share: JSON jobs, no results kept, aborts on, our wake-ups."""
    return {
        "redis_settings": jobqueue.redis_settings(settings.redis_url),
        "job_timeout": JOB_TIMEOUT_S,
        "keep_result": 0,
        "allow_abort_jobs": True,
        "job_serializer": serialize_arq_job,
        "job_deserializer": deserialize_arq_job,
        "wake_channel": keys.wake(settings.model_name),
        "drain_grace_s": settings.drain_grace_s,
    }


def _start_draining(ctx: dict[str, Any]) -> None:
    runtime = ctx.get("runtime")
    if isinstance(runtime, Runtime):
        task = asyncio.get_running_loop().create_task(runtime.presence.start_draining())
        runtime.tasks.append(task)


def run_worker(settings: WorkerSettings) -> None:
    """Blocking entry point for ``tokenferry worker``."""
    build_worker(settings).run()
