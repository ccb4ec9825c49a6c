"""Owns the arq job function: decode a job, hand it to the driver, turn shutdown into a clear error.

arq quirks stay here (with the client side in ``shared/jobqueue.py``). arq delivers
both a client's abort and a worker shutdown as ``CancelledError``; they differ in
what the client needs. After an abort nobody listens. After a shutdown the client
is still waiting, so it gets a ``failed`` event instead of a hang; the job is not
retried (``max_tries=1``), which would stream its text a second time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypedDict

from shared.codec import CodecError, decode_job
from shared.errors import Unavailable
from shared.logs import request_context
from shared.protocol import Failed, GenerationJob
from shared.settings import WorkerSettings
from shared.streams import EventWriter
from worker.driver import EngineDriver

logger = logging.getLogger(__name__)


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
    settings: WorkerSettings
    worker_id: str
    driver: EngineDriver
    writer: EventWriter
    is_aborted: Callable[[str], bool]
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


async def _report_cancellation(ctx: WorkerContext, job: GenerationJob) -> None:
    if ctx["is_aborted"](job.request_id):
        logger.info("aborted by the client")
        return
    logger.warning("interrupted by worker shutdown")
    error = Unavailable("the worker shut down before finishing this request; please retry")
    await asyncio.shield(ctx["writer"].publish_step([(job.request_id, Failed(error=error.to_info()))]))
