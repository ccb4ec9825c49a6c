"""Owns driving one batch through OpenAI's lifecycle, resumably: validate, run lines, finalize.

``run_batch`` is the batch driver of ``gateway/background/runner.py``; whoever holds the
batch's lease runs it, and a runner taking over calls it afresh. Everything it
needs lives in Redis (``gateway/batches/store.py``), so it starts from whatever
status it finds:

* ``validating``: the input file is checked whole (``gateway/batches/lines.py``);
  a bad file fails the batch with ``errors`` naming its lines;
* ``in_progress``: lines are started in file order on the model's batch lane,
  at most ``max_inflight`` at a time (each is recorded as running, with its
  request id, before it is enqueued); every ``tick_s`` the last event of each
  running line's stream is read in one pipeline, and a line whose jobs all ended
  is folded into its output line with the interactive routes' own functions.
  A runner taking over finds the running lines recorded and re-reads their
  streams instead of running them again; one whose stream is still empty is
  enqueued again, which arq refuses if it is still queued (ids are never reused);
* ``cancelling`` aborts the running lines and ends ``cancelled`` with what
  finished; past ``expires_at`` the lines not done get ``batch_expired`` error
  lines and the batch ends ``expired``; otherwise ``finalizing`` writes the
  output and error files and the batch ends ``completed``.

A worker killed mid-line needs nothing here: its job is taken over by another
worker and the same stream goes on (README, "Failures, resume and drain").
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass

from gateway.access.quota import capped
from gateway.batches import lines as batch_lines
from gateway.batches.files import FileStore
from gateway.batches.lines import InvalidBatchFile, ParsedLine
from gateway.batches.schema import Batch, BatchError, BatchErrors
from gateway.batches.store import BatchStore
from shared import keys, registry
from shared.access.ownership import ResourceKind, owner_of
from shared.jobs import jobqueue
from shared.jobs.arq_seam import QueuePool
from shared.jobs.streams import EventReader, ended_requests
from shared.protocol import GenerationJob

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchContext:
    """What every batch driver of one gateway shares."""

    pool: QueuePool
    store: BatchStore
    files: FileStore
    max_inflight: int
    max_tokens_limit: int | None
    tick_s: float = 0.2


class BatchRun:
    """One batch being driven by this gateway."""

    def __init__(self, context: BatchContext, batch: Batch, lines: list[ParsedLine]) -> None:
        self._context = context
        self._store = context.store
        self._batch = batch
        self._lines = lines
        self._running: dict[int, str] = {}
        self._job_ids: dict[tuple[int, str], list[str]] = {}  # (line, request id) -> its jobs' ids
        self._reader = EventReader(context.pool)

    async def run(self) -> None:
        """Run lines until the batch completes, is cancelled or expires."""
        self._running = await self._store.running_lines(self._batch.id)
        await self._resume_unstarted()
        while True:
            batch = await self._store.get(self._batch.id)
            if batch is None or batch.status not in ("in_progress", "cancelling", "finalizing"):
                return
            await self._collect()
            if batch.status == "cancelling":
                await self._stop("cancelled", ("cancelling",))
                return
            if batch.expires_at is not None and time.time() >= batch.expires_at:
                await self._stop("expired", ("in_progress",))
                return
            await self._top_up(int(await self._store.field(batch.id, "cursor") or 0))
            if batch.status == "finalizing" or self._is_done(
                int(await self._store.field(batch.id, "cursor") or 0)
            ):
                await self._finalize()
                return
            await asyncio.sleep(self._context.tick_s)

    def _is_done(self, cursor: int) -> bool:
        return cursor >= len(self._lines) and not self._running

    def _ids_of(self, line: int, request_id: str) -> list[str]:
        """The request ids of a running line's jobs, translated once: every tick asks for them."""
        key = (line, request_id)
        if key not in self._job_ids:
            self._job_ids[key] = [job.request_id for job in self._jobs(line, request_id)]
        return self._job_ids[key]

    def _jobs(self, line: int, request_id: str) -> list[GenerationJob]:
        jobs = batch_lines.line_jobs(self._lines[line], request_id, float(self._batch.created_at))
        deadline = float(self._batch.expires_at or 0) or None
        return [
            capped(job, self._context.max_tokens_limit).model_copy(update={"deadline_at": deadline})
            for job in jobs
        ]

    async def _top_up(self, cursor: int) -> None:
        """Start lines from ``cursor`` up to ``max_inflight`` running: recorded first, then enqueued
        together (one round trip each, and one wake-up for the workers)."""
        room = min(len(self._lines) - cursor, self._context.max_inflight - len(self._running))
        started = {line: secrets.token_hex(16) for line in range(cursor, cursor + max(0, room))}
        if not started:
            return
        await self._store.start_lines(self._batch.id, started)
        self._running.update(started)
        jobs: list[GenerationJob] = []
        for line, request_id in started.items():
            line_jobs = self._jobs(line, request_id)
            self._job_ids[(line, request_id)] = [job.request_id for job in line_jobs]
            jobs += line_jobs
            await asyncio.sleep(0)  # a line at a time: interactive requests share this event loop
        await jobqueue.enqueue_many(self._context.pool, jobs, keys.Lane.BATCH)

    async def _resume_unstarted(self) -> None:
        """After a takeover: enqueue again the running lines whose jobs never published a thing."""
        for line, request_id in self._running.items():
            for job in self._jobs(line, request_id):
                if not await self._context.pool.exists(keys.events(job.request_id)):
                    await jobqueue.enqueue(self._context.pool, job, lane=keys.Lane.BATCH)

    async def _collect(self) -> None:
        """Fold every running line whose jobs have all ended into its result line."""
        if not self._running:
            return
        lines = list(self._running.items())
        job_ids = [self._ids_of(line, rid) for line, rid in lines]
        over = await ended_requests(self._context.pool, [job_id for ids in job_ids for job_id in ids])
        ended = [
            (line, request_id, ids)
            for (line, request_id), ids in zip(lines, job_ids, strict=True)
            if all(job_id in over for job_id in ids)
        ]
        if ended:
            await self._finish(ended)

    async def _finish(self, ended: list[tuple[int, str, list[str]]]) -> None:
        """Write the result lines of ``ended`` lines (line, request id, job ids): two round trips in all."""
        histories = iter(await self._reader.histories([job_id for _, _, ids in ended for job_id in ids]))
        finished: list[tuple[int, str, bool]] = []
        for line, request_id, ids in ended:
            results = [[item.event for item in next(histories)] for _ in ids]
            output, failed = batch_lines.output_line(
                self._lines[line], _line_id(request_id), request_id, time.time(), results
            )
            finished.append((line, output.model_dump_json(), failed))
            await asyncio.sleep(0)  # a line at a time: interactive requests share this event loop
        await self._store.finish_lines(self._batch.id, finished)
        for line, request_id, _ in ended:
            self._running.pop(line, None)
            self._job_ids.pop((line, request_id), None)

    async def _stop(self, status: str, allowed: tuple[str, ...]) -> None:
        """End early (cancelled or expired): abort what runs, write what finished, then the files."""
        for line, request_id in list(self._running.items()):
            for job in self._jobs(line, request_id):
                await jobqueue.abort(self._context.pool, job.request_id)
        if status == "expired":
            await self._expire_rest()
        fields = await self._write_files()
        await self._store.transition(self._batch.id, status, allowed, **fields)
        logger.info("batch %s %s", self._batch.id, status)

    async def _expire_rest(self) -> None:
        done = await self._store.done_lines(self._batch.id)
        for index, line in enumerate(self._lines):
            if index not in done:
                line_id = _line_id(self._running.get(index) or secrets.token_hex(16))
                result = batch_lines.expired_line(line, line_id).model_dump_json()
                await self._store.finish_line(self._batch.id, index, result, failed=True)

    async def _finalize(self) -> None:
        await self._store.transition(self._batch.id, "finalizing", ("in_progress",))
        fields = await self._write_files()
        if await self._store.transition(self._batch.id, "completed", ("finalizing",), **fields):
            logger.info("batch %s completed", self._batch.id)

    async def _write_files(self) -> dict[str, str]:
        """The output file, and the error file when a line failed; their ids as batch fields."""
        tenant = await owner_of(self._context.pool, ResourceKind.BATCH, self._batch.id) or ""
        fields: dict[str, str] = {}
        for part, field in (("output", "output_file_id"), ("errors", "error_file_id")):
            content = await self._store.results(self._batch.id, part)
            if content or part == "output":
                name = f"{self._batch.id}_{part}.jsonl"
                fields[field] = (await self._context.files.create(tenant, name, "batch_output", content)).id
        return fields


async def run_batch(context: BatchContext, batch_id: str) -> None:
    """Drive ``batch_id`` from whatever status it is in to its end (the runner's batch driver)."""
    batch = await context.store.get(batch_id)
    if batch is None or batch.status in ("failed", "completed", "expired", "cancelled"):
        await context.pool.srem(keys.active("batch"), batch_id)  # type: ignore[misc]
        return
    lines = await _load_lines(context, batch)
    if lines is None:
        return
    if batch.status == "validating":
        fields: dict[str, str | int] = {"total": len(lines), "model": lines[0].request.model}
        if not await context.store.transition(batch_id, "in_progress", ("validating",), **fields):
            return  # cancelled while it was being validated
        logger.info("batch %s in progress: %d lines", batch_id, len(lines))
    await BatchRun(context, batch, lines).run()


async def _load_lines(context: BatchContext, batch: Batch) -> list[ParsedLine] | None:
    """The batch's validated lines; a bad file (or model) fails the batch and gives None."""
    content = await context.files.content(batch.input_file_id)
    try:
        if content is None:
            raise InvalidBatchFile(
                [BatchError(code="file_not_found", message="The input file no longer exists.")]
            )
        lines = batch_lines.parse_input(content, batch.endpoint, context.max_tokens_limit)
        await _require_known_model(context.pool, lines[0].request.model)
    except InvalidBatchFile as error:
        errors = BatchErrors(data=error.errors).model_dump_json()
        allowed = ("validating", "in_progress", "cancelling", "finalizing")
        await context.store.transition(batch.id, "failed", allowed, errors=errors)
        logger.info("batch %s failed validation: %s", batch.id, error)
        return None
    return lines


async def _require_known_model(pool: QueuePool, model: str) -> None:
    availability, _ = await registry.model_availability(pool, model)
    if availability is registry.ModelAvailability.UNKNOWN:
        message = f"The model `{model}` does not exist or you do not have access to it."
        raise InvalidBatchFile(
            [BatchError(code="model_not_found", message=message, param="body.model", line=1)]
        )


def _line_id(request_id: str) -> str:
    return batch_lines.LINE_ID_PREFIX + request_id
