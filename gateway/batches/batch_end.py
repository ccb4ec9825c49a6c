"""Owns what every batch driver shares, and ending a batch that cannot go on.

``BatchContext`` is what each gateway's batch drivers share (built once by
``gateway/background/work.py``). A batch ends early in two ways besides a cancel
or its window closing (``gateway/batches/run.py``): its input file is refused
(``failed``, ``errors`` naming its lines, as OpenAI reports an invalid file), or
its driver kept raising until the runner gave up on it (``give_up_batch``:
``failed`` with an error saying so). Either way a batch a client asked to cancel
ends ``cancelled``, never ``failed``, and the lines that finished are kept in its
files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.batches.files import FileStore
from gateway.batches.lines import LineRules
from gateway.batches.schema import TERMINAL_BATCH_STATUSES, BatchError, BatchErrors
from gateway.batches.store import ACTIVE_KIND, BatchStore
from gateway.dispatch.groups import GroupPools
from shared import keys
from shared.access.ownership import ResourceKind, owner_of
from shared.jobs import jobqueue
from shared.jobs.arq_seam import QueuePool

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchContext:
    """What every batch driver of one gateway shares."""

    pool: QueuePool  # the home Redis: the batch, its files, its lines' progress
    groups: GroupPools  # its lines' jobs and streams: in their model's group
    store: BatchStore
    files: FileStore
    max_inflight: int
    max_tokens_limit: int | None
    max_n: int = 16  # the operator's max_n, as the interactive routes apply it
    tick_s: float = 0.2

    def rules(self, endpoint: str) -> LineRules:
        """What the lines of a batch calling ``endpoint`` are checked against."""
        return LineRules(endpoint=endpoint, max_n=self.max_n, max_tokens_limit=self.max_tokens_limit)


async def write_files(context: BatchContext, batch_id: str) -> dict[str, str]:
    """The output file, and the error file when a line failed; their ids as batch fields."""
    tenant = await owner_of(context.pool, ResourceKind.BATCH, batch_id) or ""
    fields: dict[str, str] = {}
    for part, field in (("output", "output_file_id"), ("errors", "error_file_id")):
        content = await context.store.results(batch_id, part)
        if content or part == "output":
            name = f"{batch_id}_{part}.jsonl"
            fields[field] = (await context.files.create(tenant, name, "batch_output", content)).id
    return fields


async def end_with_errors(context: BatchContext, batch_id: str, errors: list[BatchError]) -> None:
    """End a batch that cannot go on: ``failed`` with ``errors``, or ``cancelled`` if a cancel was asked."""
    batch = await context.store.get(batch_id)
    if batch is None or batch.status in TERMINAL_BATCH_STATUSES:
        await context.pool.srem(keys.active(ACTIVE_KIND), batch_id)  # type: ignore[misc]
        return
    # A batch refused while validating ran no line: it has no files, as OpenAI's have none.
    fields = {} if batch.status == "validating" else await write_files(context, batch_id)
    data = BatchErrors(data=errors).model_dump_json()
    if await context.store.transition(
        batch_id, "failed", ("validating", "in_progress", "finalizing"), errors=data, **fields
    ):
        return
    await context.store.transition(batch_id, "cancelled", ("cancelling",), **fields)


async def give_up_batch(context: BatchContext, batch_id: str, failures: int) -> None:
    """The runner's last word on a batch whose driver raised ``failures`` times running: its running
    lines are aborted and it ends (see ``end_with_errors``)."""
    batch = await context.store.get(batch_id)
    group_pool = context.groups.for_model(batch.model if batch is not None and batch.model else "")
    for request_id in (await context.store.running_lines(batch_id)).values():
        await jobqueue.abort(group_pool, request_id)
    message = (
        f"The batch could not be run: this server failed on it {failures} times in a row. "
        "The lines that finished are in its files."
    )
    await end_with_errors(context, batch_id, [BatchError(code="server_error", message=message)])
    logger.error("batch %s given up after %d failures", batch_id, failures)
