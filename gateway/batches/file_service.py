"""Owns what one caller's Files API requests do: checked uploads, pages of its files, 404s for unknown ids.

The bytes live in ``gateway/batches/files.py``'s store; ids the caller does not own
never get here (``gateway/access/ownership.py`` answers 404 first). An upload past
the tenant's file quota (count or bytes) answers 429 with ``Retry-After``; the
anonymous caller (no keys configured: a single tenant) is not capped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, UploadFile

from gateway.background.work import BackgroundDep
from gateway.batches.files import FileQuota, FileStore
from gateway.batches.listing import page_ends
from gateway.batches.schema import FileDeleted, FileList, FileObject
from gateway.http.deps import PrincipalDep
from shared.errors import InvalidRequest, NotFound, PayloadTooLarge


@dataclass(frozen=True, slots=True)
class FileService:
    """The Files API for one caller (its tenant)."""

    store: FileStore
    tenant: str
    max_file_bytes: int
    quota: FileQuota | None  # None: the anonymous caller (no keys configured), not capped

    async def upload(self, file: UploadFile, purpose: str) -> FileObject:
        """Store a batch input file (JSONL); its lines are validated when a batch uses it."""
        if purpose != "batch":
            raise InvalidRequest(
                f"Unsupported purpose '{purpose}'; this server takes 'batch' files.", param="purpose"
            )
        content = await file.read(self.max_file_bytes + 1)
        if len(content) > self.max_file_bytes:
            raise PayloadTooLarge(f"The file is larger than the limit of {self.max_file_bytes} bytes.")
        try:
            content.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidRequest(f"The file is not UTF-8 text (byte {error.start}).", param="file") from error
        filename = file.filename or "upload.jsonl"
        return await self.store.create(self.tenant, filename, "batch", content, quota=self.quota)

    async def page(
        self, *, purpose: str | None, limit: int, after: str | None, order: Literal["asc", "desc"]
    ) -> FileList:
        """The caller's files, newest first (``order=asc``: oldest first)."""
        found = await self.store.list(self.tenant, limit=limit, after=after, purpose=purpose)
        page = found[:limit]
        if order == "asc":
            page.reverse()
        first_id, last_id = page_ends(page)
        return FileList(data=page, has_more=len(found) > limit, first_id=first_id, last_id=last_id)

    async def get(self, file_id: str) -> FileObject:
        meta = await self.store.get(file_id)
        if meta is None:
            raise _missing(file_id)
        return meta

    async def content(self, file_id: str) -> bytes:
        """The file's bytes as uploaded (or, for a batch output, its JSONL lines)."""
        content = await self.store.content(file_id)
        if content is None:
            raise _missing(file_id)
        return content

    async def delete(self, file_id: str) -> FileDeleted:
        if not await self.store.delete(self.tenant, file_id):
            raise _missing(file_id)
        return FileDeleted(id=file_id, deleted=True)


def _missing(file_id: str) -> NotFound:
    return NotFound(f"No file found with id '{file_id}'.", param="file_id")


async def get_files(background: BackgroundDep, principal: PrincipalDep) -> FileService:
    quota = None if principal.is_anonymous else background.file_quota
    return FileService(background.files, principal.tenant, background.max_file_bytes, quota)


FilesDep = Annotated[FileService, Depends(get_files)]
