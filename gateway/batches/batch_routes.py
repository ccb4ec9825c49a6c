"""Owns the Batch API: create, retrieve, list (``after``/``limit``), cancel.

Creating a batch only records it (status ``validating``); a runner
(``gateway/background/runner.py``, ``gateway/batches/run.py``) validates and runs it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from gateway.access.ownership import owned, require_owner
from gateway.background.work import BackgroundDep
from gateway.batches.schema import Batch, BatchCreateRequest, BatchList
from gateway.http.deps import JsonBody, PoolDep, PrincipalDep
from shared.access.ownership import ResourceKind
from shared.errors import InvalidRequest, NotFound

router = APIRouter(tags=["batches"])
# Someone else's id answers 404 before the handler runs (gateway/access/ownership.py).
OWNED_BATCH = [Depends(owned(ResourceKind.BATCH, "batch_id"))]


@router.post("/v1/batches", response_model=Batch, dependencies=[JsonBody])
async def create_batch(
    body: BatchCreateRequest, background: BackgroundDep, principal: PrincipalDep, pool: PoolDep
) -> Batch:
    """Accept a batch of the lines of ``input_file_id``; poll it until it completes."""
    try:
        await require_owner(pool, principal, ResourceKind.FILE, body.input_file_id)
    except NotFound as error:
        raise NotFound(f"No file found with id '{body.input_file_id}'.", param="input_file_id") from error
    meta = await background.files.get(body.input_file_id)
    if meta is None or meta.purpose != "batch":
        raise InvalidRequest(
            "The input file must be a file uploaded with purpose 'batch'.", param="input_file_id"
        )
    if body.metadata is not None and len(body.metadata) > 16:
        raise InvalidRequest("metadata holds at most 16 pairs.", param="metadata")
    return await background.batches.create(principal.tenant, body)


@router.get("/v1/batches/{batch_id}", response_model=Batch, dependencies=OWNED_BATCH)
async def retrieve_batch(batch_id: str, background: BackgroundDep) -> Batch:
    return await _batch(background, batch_id)


@router.get("/v1/batches", response_model=BatchList)
async def list_batches(
    background: BackgroundDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """The caller's batches, newest first; ``after`` is the last id of the previous page."""
    page, has_more = await background.batches.list(principal.tenant, limit=limit, after=after)
    return BatchList(
        data=page,
        has_more=has_more,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
    )


@router.post("/v1/batches/{batch_id}/cancel", response_model=Batch, dependencies=OWNED_BATCH)
async def cancel_batch(batch_id: str, background: BackgroundDep) -> Batch:
    """Stop a batch: running lines are aborted; it ends ``cancelled`` with the lines that finished."""
    await background.batches.transition(batch_id, "cancelling", ("validating", "in_progress"))
    return await _batch(background, batch_id)


async def _batch(background: BackgroundDep, batch_id: str) -> Batch:
    batch = await background.batches.get(batch_id)
    if batch is None:
        raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
    return batch
