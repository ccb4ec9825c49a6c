"""Owns driving one batch through OpenAI's lifecycle, resumably: validate, run lines, finalize.

``run_batch`` is the batch driver of ``gateway/background/runner.py``; whoever holds the
batch's lease runs it, and a runner taking over calls it afresh. Everything it
needs lives in Redis (``gateway/batches/store.py``), so it starts from whatever
status it finds:

* ``validating``: the input file is checked whole, a chunk at a time on a thread
  (``gateway/batches/input_file.py``), keeping only where each line lies; a bad
  file fails the batch with ``errors`` naming its lines, and a cancel between
  chunks stops it;
* ``in_progress``: lines are read back from the file a window at a time and
  started in file order on the model's batch lane, at most ``max_inflight`` at a
  time (each is recorded as running, with its request id, before it is enqueued;
  a line the caps of this gateway refuse gets its error line instead); every
  ``tick_s`` the last event of each running line's stream is read in one
  pipeline, and a line whose jobs all ended is folded into its output line with
  the interactive routes' own functions. A runner taking over finds the running
  lines recorded and re-reads their streams instead of running them again; one
  whose stream is still empty is enqueued again, which arq refuses if it is still
  queued (ids are never reused);
* ``cancelling`` aborts the running lines and ends ``cancelled`` with what
  finished; past ``expires_at`` the lines not done get ``batch_expired`` error
  lines and the batch ends ``expired``; otherwise ``finalizing`` writes the
  output and error files and the batch ends ``completed``.

The runner retries a driver that raises, a bounded number of times, then calls
``give_up_batch`` (``gateway/batches/batch_end.py``). A worker killed mid-line needs
nothing here: its job is taken over by another worker and the same stream goes on
(README, "Failures, resume and drain").
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass

from gateway.batches import lines as batch_lines
from gateway.batches.batch_end import BatchContext, end_with_errors, write_files
from gateway.batches.input_check import InvalidBatchFile, LineIndex
from gateway.batches.input_file import InputFile, InputFileGone
from gateway.batches.lines import ParsedLine
from gateway.batches.schema import TERMINAL_BATCH_STATUSES, Batch, BatchError
from gateway.dispatch.groups import GroupPools
from gateway.http.errors import unknown_model
from shared import keys, registry
from shared.jobs import jobqueue
from shared.jobs.streams import EventReader, ended_requests
from shared.protocol import GenerationJob

logger = logging.getLogger(__name__)

# Lines read back at a time to write the error lines of lines a closing window never ran.
EXPIRE_WINDOW = 1000


@dataclass(slots=True)
class _Line:
    """A running line: its request id and, read back from the file, what its jobs and output need."""

    request_id: str
    parsed: ParsedLine


class BatchRun:
    """One batch being driven by this gateway."""

    def __init__(
        self, context: BatchContext, batch: Batch, source: InputFile, index: LineIndex, model: str | None
    ) -> None:
        self._context = context
        self._store = context.store
        self._batch = batch
        self._source = source
        self._index = index
        self._model = model  # the canonical model its lines name (an alias resolved), for their queue
        self._rules = context.rules(batch.endpoint)
        self._running: dict[int, _Line] = {}
        self._job_ids: dict[int, list[str]] = {}  # line -> its jobs' ids
        # The lines' jobs and streams are in their model's group; the batch's records stay home.
        self._group_pool = context.groups.for_model(model or batch.model or "")
        self._reader = EventReader(self._group_pool)

    async def run(self) -> None:
        """Run lines until the batch completes, is cancelled or expires."""
        await self._resume_running()
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
            await self._top_up(await self._cursor())
            if batch.status == "finalizing" or self._is_done(await self._cursor()):
                await self._finalize()
                return
            await asyncio.sleep(self._context.tick_s)

    async def _cursor(self) -> int:
        return int(await self._store.field(self._batch.id, "cursor") or 0)

    def _is_done(self, cursor: int) -> bool:
        return cursor >= len(self._index) and not self._running

    def _jobs(self, line: int) -> list[GenerationJob]:
        running = self._running[line]
        created_at = float(self._batch.created_at)
        jobs = batch_lines.line_jobs(running.parsed, running.request_id, created_at, self._rules)
        deadline = float(self._batch.expires_at or 0) or None
        update: dict[str, object] = {"deadline_at": deadline}
        if self._model is not None:
            update["model"] = self._model
        return [job.model_copy(update=update) for job in jobs]

    def _track(self, line: int, request_id: str, parsed: ParsedLine) -> list[GenerationJob]:
        """Hold a running line; its jobs, whose ids every tick asks for."""
        self._running[line] = _Line(request_id, parsed)
        jobs = self._jobs(line)
        self._job_ids[line] = [job.request_id for job in jobs]
        return jobs

    async def _top_up(self, cursor: int) -> None:
        """Start lines from ``cursor`` up to ``max_inflight`` running: read back, recorded, then
        enqueued together (one round trip each, and one wake-up for the workers)."""
        room = min(len(self._index) - cursor, self._context.max_inflight - len(self._running))
        if room <= 0:
            return
        checked = await self._source.lines(self._index, cursor, room, self._rules)
        started: dict[int, ParsedLine] = {}
        refused: list[tuple[int, str, bool]] = []
        for line, outcome in enumerate(checked, start=cursor):
            if isinstance(outcome, ParsedLine):
                started[line] = outcome
            else:
                request_id = secrets.token_hex(16)
                custom_id = (await self._custom_ids(line, 1))[0]
                refusal = batch_lines.error_line(custom_id, _line_id(request_id), request_id, outcome)
                refused.append((line, refusal.model_dump_json(), True))
        await self._store.finish_lines(self._batch.id, refused)  # before the cursor moves past them
        request_ids = {line: secrets.token_hex(16) for line in started}
        await self._store.start_lines(self._batch.id, request_ids, cursor + room)
        jobs: list[GenerationJob] = []
        for line, parsed in started.items():
            jobs += self._track(line, request_ids[line], parsed)
            await asyncio.sleep(0)  # a line at a time: interactive requests share this event loop
        if jobs:
            await jobqueue.enqueue_many(self._group_pool, jobs, keys.Lane.BATCH)

    async def _resume_running(self) -> None:
        """After a takeover: read back the lines recorded as running, and enqueue again those whose
        jobs never published a thing."""
        for line, request_id in (await self._store.running_lines(self._batch.id)).items():
            [outcome] = await self._source.lines(self._index, line, 1, self._rules)
            if not isinstance(outcome, ParsedLine):
                await jobqueue.abort(self._group_pool, request_id)
                custom_id = (await self._custom_ids(line, 1))[0]
                refusal = batch_lines.error_line(custom_id, _line_id(request_id), request_id, outcome)
                await self._store.finish_line(self._batch.id, line, refusal.model_dump_json(), failed=True)
                continue
            for job in self._track(line, request_id, outcome):
                if not await self._group_pool.exists(keys.events(job.request_id)):
                    await jobqueue.enqueue(self._group_pool, job, lane=keys.Lane.BATCH)

    async def _collect(self) -> None:
        """Fold every running line whose jobs have all ended into its result line."""
        if not self._running:
            return
        over = await ended_requests(self._group_pool, [rid for ids in self._job_ids.values() for rid in ids])
        ended = [line for line, ids in self._job_ids.items() if all(job_id in over for job_id in ids)]
        if ended:
            await self._finish(ended)

    async def _finish(self, ended: list[int]) -> None:
        """Write the result lines of ``ended`` lines: two round trips in all."""
        histories = iter(await self._reader.histories([rid for line in ended for rid in self._job_ids[line]]))
        finished: list[tuple[int, str, bool]] = []
        for line in ended:
            running = self._running[line]
            results = [[item.event for item in next(histories)] for _ in self._job_ids[line]]
            output, failed = batch_lines.output_line(
                running.parsed, _line_id(running.request_id), running.request_id, time.time(), results
            )
            finished.append((line, output.model_dump_json(), failed))
            await asyncio.sleep(0)  # a line at a time: interactive requests share this event loop
        await self._store.finish_lines(self._batch.id, finished)
        for line in ended:
            self._running.pop(line, None)
            self._job_ids.pop(line, None)

    async def _stop(self, status: str, allowed: tuple[str, ...]) -> None:
        """End early (cancelled or expired): abort what runs, write what finished, then the files."""
        for job_ids in self._job_ids.values():
            for job_id in job_ids:
                await jobqueue.abort(self._group_pool, job_id)
        if status == "expired":
            await self._expire_rest()
        fields = await write_files(self._context, self._batch.id)
        await self._store.transition(self._batch.id, status, allowed, **fields)
        logger.info("batch %s %s", self._batch.id, status)

    async def _expire_rest(self) -> None:
        """The error lines of every line not done: those running, then those never started."""
        expired = [
            (line, _expired(running.parsed.custom_id, running.request_id), True)
            for line, running in self._running.items()
        ]
        await self._store.finish_lines(self._batch.id, expired)
        for first in range(await self._cursor(), len(self._index), EXPIRE_WINDOW):
            custom_ids = await self._custom_ids(first, min(EXPIRE_WINDOW, len(self._index) - first))
            expired = [
                (line, _expired(custom_id, secrets.token_hex(16)), True)
                for line, custom_id in enumerate(custom_ids, start=first)
            ]
            await self._store.finish_lines(self._batch.id, expired)

    async def _custom_ids(self, first: int, count: int) -> list[str]:
        return await self._source.custom_ids(self._index, first, count, self._batch.endpoint)

    async def _finalize(self) -> None:
        await self._store.transition(self._batch.id, "finalizing", ("in_progress",))
        fields = await write_files(self._context, self._batch.id)
        if await self._store.transition(self._batch.id, "completed", ("finalizing",), **fields):
            logger.info("batch %s completed", self._batch.id)


async def run_batch(context: BatchContext, batch_id: str) -> None:
    """Drive ``batch_id`` from whatever status it is in to its end (the runner's batch driver)."""
    batch = await context.store.get(batch_id)
    if batch is None or batch.status in TERMINAL_BATCH_STATUSES:
        await context.pool.srem(keys.active("batch"), batch_id)  # type: ignore[misc]
        return
    source = InputFile(context.files, batch.input_file_id)
    try:
        index, model = await _input_index(context, batch, source)
    except InvalidBatchFile as error:
        logger.info("batch %s failed validation: %s", batch.id, error)
        await end_with_errors(context, batch.id, error.errors)
        return
    except InputFileGone:
        message = "The input file was deleted before the batch was done with it."
        await end_with_errors(context, batch.id, [BatchError(code="file_not_found", message=message)])
        return
    await BatchRun(context, batch, source, index, model).run()


async def _input_index(
    context: BatchContext, batch: Batch, source: InputFile
) -> tuple[LineIndex, str | None]:
    """Where each line of the batch lies, and the canonical model they run on; validating the file
    first if that is where the batch is."""
    if batch.status != "validating":
        return await source.index(), batch.model

    async def still_validating() -> bool:
        return await context.store.field(batch.id, "status") == "validating"

    checked = await source.validate(context.rules(batch.endpoint), still_validating)
    if checked is None:
        return LineIndex(), None  # cancelled while validating: nothing to run, the run ends it cancelled
    index, requested = checked
    model = await _require_known_model(context.groups, requested)
    fields: dict[str, str | int] = {"total": len(index), "model": model}
    if await context.store.transition(batch.id, "in_progress", ("validating",), **fields):
        logger.info("batch %s in progress: %d lines", batch.id, len(index))
    return index, model  # whatever the status is now, the run acts on it (a cancel ends it cancelled)


async def _require_known_model(groups: GroupPools, model: str) -> str:
    """The canonical model ``model`` names (the batch records it, as OpenAI records the snapshot an
    alias meant); ``model`` itself when no worker is live to say (a batch waits for one)."""
    availability, info = await registry.model_availability(groups.for_model(model), model)
    if availability is registry.ModelAvailability.UNKNOWN:
        message = unknown_model(model, registry.served_names(await groups.live_workers())).message
        raise InvalidBatchFile(
            [BatchError(code="model_not_found", message=message, param="body.model", line=1)]
        )
    return model if info is None else info.model


def _expired(custom_id: str, request_id: str) -> str:
    return batch_lines.expired_line(custom_id, _line_id(request_id)).model_dump_json()


def _line_id(request_id: str) -> str:
    return batch_lines.LINE_ID_PREFIX + request_id
