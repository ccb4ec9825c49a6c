"""Owns the job handlers: decode a job, hand it to the driver, turn a shutdown into a handover.

arq runs them (through ``shared/jobs/arq_seam.py``, which lists what they rely on:
``Retry``, ``max_tries``, the ctx) and hands each one a ctx holding the worker's
``WorkerRuntime``; everything a handler touches it reaches through that runtime.
arq delivers both a client's abort and a worker shutdown as ``CancelledError``;
they differ in what the client needs. After an abort nobody listens. After a
shutdown the client is still waiting, so the job is handed over: re-enqueued as its
next attempt, which another worker resumes from the stream. A plain retry would
stream its text a second time: an attempt arq runs again (after ``Retry``, or a
cancellation, which arq leaves queued) starts only if its run record still names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, TypedDict

from pydantic import ValidationError
from redis.exceptions import RedisError

from shared.codec import CodecError, decode_job
from shared.errors import TokenferryError, WorkerFailed
from shared.jobs import run_records
from shared.jobs.arq_seam import Retry
from shared.jobs.replies import send_reply
from shared.logs import request_context
from shared.protocol import Failed, GenerationJob, TokenizeJob, TokenizeReply
from worker.driver.lifecycle import JobLifecycle
from worker.metrics import FinishedReason
from worker.queue.backoff import outage_delay
from worker.runtime import WorkerRuntime

logger = logging.getLogger(__name__)

# What a client learns of a bug in the worker; the traceback goes to the worker's log.
WORKER_FAILED_MESSAGE = "The worker failed on this request; please retry. The server's log has the detail."
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


class WorkerContext(TypedDict):
    """The ctx arq hands a job: the worker's runtime, and arq's own entries the handlers read."""

    runtime: WorkerRuntime  # given to both lanes' jobs when the runtime starts
    job_id: str  # arq's id of the attempt being run, set by arq per job


async def generate(ctx: WorkerContext, payload: Any) -> None:
    """arq entry point for one generation request."""
    runtime = ctx["runtime"]
    try:
        job = decode_job(payload)
    except CodecError as error:
        logger.error("dropping a job this worker cannot read: %s", error)
        return
    with request_context(job.request_id):
        logger.info("started on %s (%s)", runtime.worker_id, job.model)
        try:
            await runtime.driver.run(job)
        except asyncio.CancelledError:
            await _report_cancellation(runtime, ctx["job_id"], job)
            raise
        except RedisError as error:
            # Only the start talks to Redis without retrying (claim, preparation, Accepted): Redis
            # went away there. The job must neither fail for it nor stay claimed by this live
            # worker, where no reaper would take it over: hand it on, or run it again.
            logger.warning("Redis failed while starting (%s); retrying once Redis is back", error)
            if not await _hand_over_after_outage(runtime.lifecycle, job):
                raise Retry(defer=outage_delay(0)) from error
        except Exception:  # a bug, not the client's fault: it must still get an answer
            logger.exception("failed")  # the detail stays in the log: exception text is no client's business
            await _report_failure(runtime, job, WorkerFailed(WORKER_FAILED_MESSAGE))


async def _hand_over_after_outage(lifecycle: JobLifecycle, job: GenerationJob) -> bool:
    """Hand ``job`` over as soon as Redis answers again; False if this worker never claimed it."""
    failures = 0
    while True:
        try:
            return await lifecycle.hand_over(job)
        except RedisError:
            await asyncio.sleep(outage_delay(failures))
            failures += 1


async def _report_failure(runtime: WorkerRuntime, job: GenerationJob, error: TokenferryError) -> None:
    runtime.metrics.record_end(FinishedReason.ERROR)
    with contextlib.suppress(RedisError):
        await runtime.writer.publish_step([(job.request_id, Failed(error=error.to_info()))])
        await run_records.end(runtime.pool, job, runtime.worker_id)


async def _report_cancellation(runtime: WorkerRuntime, job_id: str, job: GenerationJob) -> None:
    if runtime.is_aborting(job_id):
        logger.info("aborted by the client")
        runtime.metrics.record_end(FinishedReason.ABORT)
        with contextlib.suppress(RedisError):  # else its record lingers until its deadline
            await asyncio.shield(run_records.end(runtime.pool, job, runtime.worker_id))
        return
    # A shutdown (the drain's grace ran out): another worker resumes it from its stream.
    logger.warning("interrupted by worker shutdown; handing it over")
    try:
        await asyncio.shield(runtime.lifecycle.hand_over(job))
    except RedisError as error:
        # Not lost either: the run record outlives us and the reaper re-queues it.
        logger.warning("handover failed (%s); the reaper will take it over", error)


async def tokenize(ctx: WorkerContext, payload: Any) -> None:
    """arq entry point for one tokenize or detokenize request; the answer goes to its reply key."""
    runtime = ctx["runtime"]
    try:
        job = TokenizeJob.model_validate(payload)
    except ValidationError as error:
        logger.error("dropping a tokenize job this worker cannot read: %s", error)
        return
    with request_context(job.request_id):
        reply: TokenizeReply
        try:
            reply = await asyncio.to_thread(runtime.tokenize_service.answer, job)
        except TokenferryError as error:
            reply = Failed(error=error.to_info())
        await send_reply(runtime.pool, job.request_id, reply)
