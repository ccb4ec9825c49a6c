"""Owns file storage in Redis: uploaded batch inputs and the batch outputs the runner writes.

A file is two keys, its object (``keys.file``) and its bytes (``keys.file_content``,
one string: Redis strings hold up to 512 MB and the upload limit is well under
that), plus its place in its tenant's index for listing. All of them expire
``retention_s`` after creation, which is the file object's ``expires_at``; the
tenant that uploaded it is recorded as its owner for the same time
(``shared/access/ownership.py``), and routes answer 404 to anyone else.
"""

from __future__ import annotations

import secrets
import time
from contextlib import aclosing

from redis.asyncio import Redis

from gateway.batches.listing import newest_after
from gateway.batches.schema import FileObject, FilePurpose
from shared import keys
from shared.access.ownership import ResourceKind, record_owner

FILE_ID_PREFIX = "file-"
_META = "object"


def new_file_id() -> str:
    return FILE_ID_PREFIX + secrets.token_hex(16)


class FileStore:
    """Files of all tenants in one Redis; one per gateway process."""

    def __init__(self, redis: Redis, retention_s: int) -> None:
        self._redis = redis
        self._retention_s = retention_s

    async def create(self, tenant: str, filename: str, purpose: FilePurpose, content: bytes) -> FileObject:
        """Store ``content`` as a new file owned by ``tenant``."""
        now = int(time.time())
        meta = FileObject(
            id=new_file_id(),
            bytes=len(content),
            created_at=now,
            filename=filename,
            purpose=purpose,
            expires_at=now + self._retention_s,
        )
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.file(meta.id), _META, meta.model_dump_json())
            pipe.expire(keys.file(meta.id), self._retention_s)
            pipe.set(keys.file_content(meta.id), content, ex=self._retention_s)
            pipe.zadd(keys.files_index(tenant), {meta.id: now})
            pipe.expire(keys.files_index(tenant), self._retention_s)
            await pipe.execute()
        await record_owner(self._redis, ResourceKind.FILE, meta.id, tenant, self._retention_s)
        return meta

    async def get(self, file_id: str) -> FileObject | None:
        raw = await self._redis.hget(keys.file(file_id), _META)  # type: ignore[misc]
        return None if raw is None else FileObject.model_validate_json(raw)

    async def content(self, file_id: str) -> bytes | None:
        raw = await self._redis.get(keys.file_content(file_id))
        return None if raw is None else bytes(raw)

    async def content_range(self, file_id: str, start: int, end: int) -> bytes | None:
        """Bytes ``start`` to ``end`` (exclusive) of the file, not reading the rest; None once it is gone."""
        if end <= start:  # GETRANGE's end is inclusive, and -1 would mean the whole file
            return b"" if await self._redis.exists(keys.file_content(file_id)) else None
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.exists(keys.file_content(file_id))
            pipe.getrange(keys.file_content(file_id), start, end - 1)
            exists, raw = await pipe.execute()
        return bytes(raw) if exists else None

    async def size(self, file_id: str) -> int | None:
        """The file's length in bytes; None when there is no such file."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.exists(keys.file_content(file_id))
            pipe.strlen(keys.file_content(file_id))
            exists, length = await pipe.execute()
        return int(length) if exists else None

    async def list(
        self, tenant: str, *, limit: int, after: str | None, purpose: str | None
    ) -> list[FileObject]:
        """The tenant's files, newest first, after the id ``after``: ``limit`` of them and one more
        when there are more; expired ones are pruned."""
        found: list[FileObject] = []
        listed = newest_after(self._redis, keys.files_index(tenant), after, self.get)
        async with aclosing(listed) as files:
            async for meta in files:
                if purpose is None or meta.purpose == purpose:
                    found.append(meta)
                if len(found) > limit:
                    break
        return found

    async def delete(self, tenant: str, file_id: str) -> bool:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(
                keys.file(file_id), keys.file_content(file_id), keys.owner(ResourceKind.FILE, file_id)
            )
            pipe.zrem(keys.files_index(tenant), file_id)
            deleted, _ = await pipe.execute()
        return int(deleted) > 0
