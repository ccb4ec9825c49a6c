"""Owns the Files and Batch API routes: /v1/files (upload, list, retrieve, content, delete), /v1/batches.

The work is ``file_service.py``'s and ``batch_service.py``'s, beside this module.
Someone else's id answers 404 before a handler runs (``gateway/access/ownership.py``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Query, UploadFile
from fastapi.responses import Response

from gateway.access.ownership import owned
from gateway.batches.batch_service import BatchesDep
from gateway.batches.file_service import FilesDep
from gateway.batches.schema import Batch, BatchCreateRequest, BatchList, FileDeleted, FileList, FileObject
from gateway.http.deps import JsonBody
from shared.access.ownership import ResourceKind

files_router = APIRouter(tags=["files"])
batches_router = APIRouter(tags=["batches"])
OWNED_FILE = [Depends(owned(ResourceKind.FILE, "file_id"))]
OWNED_BATCH = [Depends(owned(ResourceKind.BATCH, "batch_id"))]
# What a multipart envelope adds around the file: the body limit of /v1/files is the file's plus this.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


@files_router.post("/v1/files", response_model=FileObject)
async def upload_file(
    file: UploadFile,
    purpose: Annotated[str, Form(description="Only 'batch': a JSONL file of batch requests.")],
    files: FilesDep,
) -> FileObject:
    """Store a batch input file (JSONL); its lines are validated when a batch uses it."""
    return await files.upload(file, purpose)


@files_router.get("/v1/files", response_model=FileList)
async def list_files(
    files: FilesDep,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    """The caller's files, newest first (``order=asc``: oldest first)."""
    return await files.page(purpose=purpose, limit=limit, after=after, order=order)


@files_router.get("/v1/files/{file_id}", response_model=FileObject, dependencies=OWNED_FILE)
async def retrieve_file(file_id: str, files: FilesDep) -> FileObject:
    return await files.get(file_id)


@files_router.get("/v1/files/{file_id}/content", response_class=Response, dependencies=OWNED_FILE)
async def file_content(file_id: str, files: FilesDep) -> Response:
    """The file's bytes as uploaded (or, for a batch output, its JSONL lines)."""
    return Response(await files.content(file_id), media_type="application/octet-stream")


@files_router.delete("/v1/files/{file_id}", response_model=FileDeleted, dependencies=OWNED_FILE)
async def delete_file(file_id: str, files: FilesDep) -> FileDeleted:
    return await files.delete(file_id)


@batches_router.post("/v1/batches", response_model=Batch, dependencies=[JsonBody])
async def create_batch(body: BatchCreateRequest, batches: BatchesDep) -> Batch:
    """Accept a batch of the lines of ``input_file_id``; poll it until it completes."""
    return await batches.create(body)


@batches_router.get("/v1/batches/{batch_id}", response_model=Batch, dependencies=OWNED_BATCH)
async def retrieve_batch(batch_id: str, batches: BatchesDep) -> Batch:
    return await batches.get(batch_id)


@batches_router.get("/v1/batches", response_model=BatchList)
async def list_batches(
    batches: BatchesDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """The caller's batches, newest first; ``after`` is the last id of the previous page."""
    return await batches.page(limit=limit, after=after)


@batches_router.post("/v1/batches/{batch_id}/cancel", response_model=Batch, dependencies=OWNED_BATCH)
async def cancel_batch(batch_id: str, batches: BatchesDep) -> Batch:
    """Stop a batch: running lines are aborted; it ends ``cancelled`` with the lines that finished."""
    return await batches.cancel(batch_id)
