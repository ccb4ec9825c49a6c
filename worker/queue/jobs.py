"""Owns the arq job functions: decode a job, hand it to the driver, turn a shutdown into a handover.

arq quirks stay here (with the client side in ``shared/jobs/jobqueue.py``). arq delivers
both a client's abort and a worker shutdown as ``CancelledError``; they differ in
what the client needs. After an abort nobody listens. After a shutdown the client
is still waiting, so the job is handed over: re-enqueued as its next attempt, which
another worker resumes from the stream. arq itself never retries it (``max_tries=1``):
a plain retry would stream its text a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypedDict

from arq.connections import ArqRedis
from arq.worker import Retry
from pydantic import ValidationError
from redis.exceptions import RedisError

from shared.codec import CodecError, decode_job
from shared.errors import TokenferryError, WorkerFailed
from shared.jobs import run_records
from shared.jobs.replies import send_reply
from shared.jobs.streams import EventWriter
from shared.logs import request_context
from shared.protocol import Failed, GenerationJob, TokenizeJob, TokenizeReply
from shared.settings import WorkerSettings
from worker.driver.engine_driver import EngineDriver
from worker.queue.backoff import outage_delay
from worker.requests.tokenize_replies import TokenizeService

logger = logging.getLogger(__name__)

# arq runs a job again when it raises Retry, up to this many times (a Redis outage at its start).
GENERATE_MAX_TRIES = 20


class RedactJobArguments(logging.Filter):
    """arq logs each job's first 80 argument characters at INFO; ours hold prompt text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) == 4 and "→" in str(record.msg):
            elapsed, ref, _arguments, extra = record.args
            record.args = (elapsed, ref, "…", extra)
        return True


def install_log_redaction() -> None:
    """Idempotently attach the redaction to arq's worker logger."""
    arq_logger = logging.getLogger("arq.worker")
    if not any(isinstance(existing, RedactJobArguments) for existing in arq_logger.filters):
        arq_logger.addFilter(RedactJobArguments())


class WorkerContext(TypedDict, total=False):
    redis: ArqRedis  # arq's own pool, set by arq before start-up
    tokenize_service: TokenizeService
    settings: WorkerSettings
    worker_id: str
    driver: EngineDriver
    writer: EventWriter
    is_aborted: Callable[[str], bool]
    job_id: str  # arq's id of the attempt being run, set by arq per job
    queue_worker: object  # worker.queue.consumer.QueueWorker of the interactive lane
    runtime: object  # worker.main.Runtime, owned by the start-up and shut-down hooks


async def generate(ctx: WorkerContext, payload: Any) -> None:
    """arq entry point for one generation request."""
    try:
        job = decode_job(payload)
    except CodecError as error:
        logger.error("dropping a job this worker cannot read: %s", error)
        return
    with request_context(job.request_id):
        logger.info("started on %s (%s)", ctx["worker_id"], job.model)
        try:
            await ctx["driver"].run(job)
        except asyncio.CancelledError:
            await _report_cancellation(ctx, job)
            raise
        except RedisError as error:
            # Only the start talks to Redis without retrying (claim, admission, Accepted): Redis
            # went away there. The job must neither fail for it nor stay claimed by this live
            # worker, where no reaper would take it over: hand it on, or run it again.
            logger.warning("Redis failed while starting (%s); retrying once Redis is back", error)
            if not await _hand_over_after_outage(ctx, job):
                raise Retry(defer=outage_delay(0)) from error
        except Exception as error:  # a bug, not the client's fault: it must still get an answer
            logger.exception("failed")
            await _report_failure(ctx, job, WorkerFailed(f"the worker failed on this request: {error}"))


async def _hand_over_after_outage(ctx: WorkerContext, job: GenerationJob) -> bool:
    """Hand ``job`` over as soon as Redis answers again; False if this worker never claimed it."""
    failures = 0
    while True:
        try:
            return await ctx["driver"].lifecycle.hand_over(job)
        except RedisError:
            await asyncio.sleep(outage_delay(failures))
            failures += 1


async def _report_failure(ctx: WorkerContext, job: GenerationJob, error: TokenferryError) -> None:
    with contextlib.suppress(RedisError):
        await ctx["writer"].publish_step([(job.request_id, Failed(error=error.to_info()))])
        await run_records.end(ctx["redis"], job, ctx["worker_id"])


async def _report_cancellation(ctx: WorkerContext, job: GenerationJob) -> None:
    if ctx["is_aborted"](ctx["job_id"]):
        logger.info("aborted by the client")
        with contextlib.suppress(RedisError):  # else its record lingers until its deadline
            await asyncio.shield(run_records.end(ctx["redis"], job, ctx["worker_id"]))
        return
    # A shutdown (the drain's grace ran out): another worker resumes it from its stream.
    logger.warning("interrupted by worker shutdown; handing it over")
    try:
        await asyncio.shield(ctx["driver"].lifecycle.hand_over(job))
    except RedisError as error:
        # Not lost either: the run record outlives us and the reaper re-queues it.
        logger.warning("handover failed (%s); the reaper will take it over", error)


async def tokenize(ctx: WorkerContext, payload: Any) -> None:
    """arq entry point for one tokenize or detokenize request; the answer goes to its reply key."""
    try:
        job = TokenizeJob.model_validate(payload)
    except ValidationError as error:
        logger.error("dropping a tokenize job this worker cannot read: %s", error)
        return
    with request_context(job.request_id):
        reply: TokenizeReply
        try:
            reply = await asyncio.to_thread(ctx["tokenize_service"].answer, job)
        except TokenferryError as error:
            reply = Failed(error=error.to_info())
        await send_reply(ctx["redis"], job.request_id, reply)
