"""Owns what one caller's Batch API requests do: checked creations, pages of its batches, cancels, 404s.

Creating a batch only records it (status ``validating``); a runner
(``gateway/background/runner.py``, ``gateway/batches/run.py``) validates and runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends

from gateway.access.ownership import Ownership, OwnershipDep
from gateway.background.work import BackgroundDep
from gateway.batches.files import FileStore
from gateway.batches.listing import page_ends
from gateway.batches.schema import Batch, BatchCreateRequest, BatchList
from gateway.batches.store import BatchStore
from gateway.http.deps import PrincipalDep
from shared.access.ownership import ResourceKind
from shared.errors import InvalidRequest, NotFound

# OpenAI's bound on a batch's metadata.
MAX_METADATA_PAIRS = 16


@dataclass(frozen=True, slots=True)
class BatchService:
    """The Batch API for one caller (its tenant)."""

    store: BatchStore
    files: FileStore
    ownership: Ownership
    tenant: str

    async def create(self, body: BatchCreateRequest) -> Batch:
        """Accept a batch of the lines of ``input_file_id``, once the caller's batch file is known."""
        try:
            await self.ownership.require(ResourceKind.FILE, body.input_file_id)
        except NotFound as error:
            raise NotFound(f"No file found with id '{body.input_file_id}'.", param="input_file_id") from error
        meta = await self.files.get(body.input_file_id)
        if meta is None or meta.purpose != "batch":
            raise InvalidRequest(
                "The input file must be a file uploaded with purpose 'batch'.", param="input_file_id"
            )
        if body.metadata is not None and len(body.metadata) > MAX_METADATA_PAIRS:
            raise InvalidRequest(f"metadata holds at most {MAX_METADATA_PAIRS} pairs.", param="metadata")
        return await self.store.create(self.tenant, body)

    async def get(self, batch_id: str) -> Batch:
        batch = await self.store.get(batch_id)
        if batch is None:
            raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
        return batch

    async def page(self, *, limit: int, after: str | None) -> BatchList:
        """The caller's batches, newest first; ``after`` is the last id of the previous page."""
        page, has_more = await self.store.list(self.tenant, limit=limit, after=after)
        first_id, last_id = page_ends(page)
        return BatchList(data=page, has_more=has_more, first_id=first_id, last_id=last_id)

    async def cancel(self, batch_id: str) -> Batch:
        """Stop a batch: running lines are aborted; it ends ``cancelled`` with the lines that finished."""
        await self.store.transition(batch_id, "cancelling", ("validating", "in_progress"))
        return await self.get(batch_id)


async def get_batches(
    background: BackgroundDep, ownership: OwnershipDep, principal: PrincipalDep
) -> BatchService:
    return BatchService(background.batches, background.files, ownership, principal.tenant)


BatchesDep = Annotated[BatchService, Depends(get_batches)]
