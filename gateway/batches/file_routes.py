"""Owns the Files API: upload (multipart, purpose=batch, JSONL), list, retrieve, content, delete."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Query, UploadFile
from fastapi.responses import Response

from gateway.access.ownership import owned
from gateway.background.work import BackgroundDep
from gateway.batches.schema import FileDeleted, FileList, FileObject
from gateway.http.deps import PrincipalDep
from shared.access.ownership import ResourceKind
from shared.errors import InvalidRequest, NotFound, PayloadTooLarge

router = APIRouter(tags=["files"])
# Someone else's id answers 404 before the handler runs (gateway/access/ownership.py).
OWNED_FILE = [Depends(owned(ResourceKind.FILE, "file_id"))]
# What a multipart envelope adds around the file: the body limit of /v1/files is the file's plus this.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


@router.post("/v1/files", response_model=FileObject)
async def upload_file(
    file: UploadFile,
    purpose: Annotated[str, Form(description="Only 'batch': a JSONL file of batch requests.")],
    background: BackgroundDep,
    principal: PrincipalDep,
) -> FileObject:
    """Store a batch input file (JSONL); its lines are validated when a batch uses it."""
    if purpose != "batch":
        raise InvalidRequest(
            f"Unsupported purpose '{purpose}'; this server takes 'batch' files.", param="purpose"
        )
    content = await file.read(background.max_file_bytes + 1)
    if len(content) > background.max_file_bytes:
        raise PayloadTooLarge(f"The file is larger than the limit of {background.max_file_bytes} bytes.")
    try:
        content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidRequest(f"The file is not UTF-8 text (byte {error.start}).", param="file") from error
    filename = file.filename or "upload.jsonl"
    return await background.files.create(principal.tenant, filename, "batch", content)


@router.get("/v1/files", response_model=FileList)
async def list_files(
    background: BackgroundDep,
    principal: PrincipalDep,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    """The caller's files, newest first (``order=asc``: oldest first)."""
    found = await background.files.list(principal.tenant, limit=limit, after=after, purpose=purpose)
    page = found[:limit]
    if order == "asc":
        page.reverse()
    return FileList(
        data=page,
        has_more=len(found) > limit,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
    )


@router.get("/v1/files/{file_id}", response_model=FileObject, dependencies=OWNED_FILE)
async def retrieve_file(file_id: str, background: BackgroundDep) -> FileObject:
    meta = await background.files.get(file_id)
    if meta is None:
        raise _missing(file_id)
    return meta


@router.get("/v1/files/{file_id}/content", response_class=Response, dependencies=OWNED_FILE)
async def file_content(file_id: str, background: BackgroundDep) -> Response:
    """The file's bytes as uploaded (or, for a batch output, its JSONL lines)."""
    content = await background.files.content(file_id)
    if content is None:
        raise _missing(file_id)
    return Response(content, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", response_model=FileDeleted, dependencies=OWNED_FILE)
async def delete_file(file_id: str, background: BackgroundDep, principal: PrincipalDep) -> FileDeleted:
    if not await background.files.delete(principal.tenant, file_id):
        raise _missing(file_id)
    return FileDeleted(id=file_id, deleted=True)


def _missing(file_id: str) -> NotFound:
    return NotFound(f"No file found with id '{file_id}'.", param="file_id")
