"""Owns file storage in Redis: uploaded batch inputs and the batch outputs the runner writes.

A file is two keys, its object (``keys.file``) and its bytes (``keys.file_content``,
one string: Redis strings hold up to 512 MB and the upload limit is well under
that), plus its place in its tenant's index for listing. All of them expire
``retention_s`` after creation, which is the file object's ``expires_at``; the
tenant that uploaded it is recorded as its owner for the same time
(``shared/access/ownership.py``), and routes answer 404 to anyone else.

Quota: a tenant stores at most ``max_files`` files and ``max_bytes`` bytes at once
(``FileQuota``; 429 past either). What it stores is its index, with each file's
size beside it (``keys.files_usage``); one script drops what expired, counts, and
reserves the new file's place, so uploads racing on several gateways cannot
overshoot together. Every file counts, batch outputs included, but only uploads
are refused: a batch that ran must be able to write its results.
"""

from __future__ import annotations

import secrets
import time
from contextlib import aclosing
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.batches.listing import newest_after
from gateway.batches.schema import FileObject, FilePurpose
from shared import keys
from shared.access.ownership import ResourceKind, record_owner
from shared.errors import QuotaExceeded

FILE_ID_PREFIX = "file-"
_META = "object"


def new_file_id() -> str:
    return FILE_ID_PREFIX + secrets.token_hex(16)


# KEYS: the tenant's index, its sizes. ARGV: now, retention, the file id, its size, max files, max bytes.
# Returns {0} once the place is reserved, else {files, bytes, when the oldest file expires}.
_RESERVE = """
local now, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - retention)
for _, id in ipairs(expired) do
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
end
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local stored = 0
for _, id in ipairs(ids) do
    stored = stored + (tonumber(redis.call('HGET', KEYS[2], id)) or 0)
end
if #ids + 1 > tonumber(ARGV[5]) or stored + tonumber(ARGV[4]) > tonumber(ARGV[6]) then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    local frees_at = oldest[2] and (tonumber(oldest[2]) + retention) or now
    return {#ids, stored, frees_at}
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], retention)
redis.call('EXPIRE', KEYS[2], retention)
return {0}
"""


@dataclass(frozen=True, slots=True)
class FileQuota:
    """What one tenant may store at once."""

    max_files: int
    max_bytes: int


# Batch outputs: stored and counted, never refused (2**53: the largest integer Lua counts exactly).
_UNLIMITED = FileQuota(max_files=2**53, max_bytes=2**53)


class FileStore:
    """Files of all tenants in one Redis; one per gateway process."""

    def __init__(self, redis: Redis, retention_s: int) -> None:
        self._redis = redis
        self._retention_s = retention_s
        self._reserve = redis.register_script(_RESERVE)

    async def create(
        self,
        tenant: str,
        filename: str,
        purpose: FilePurpose,
        content: bytes,
        *,
        quota: FileQuota | None = None,
    ) -> FileObject:
        """Store ``content`` as a new file owned by ``tenant``; 429 when ``quota`` has no room for it."""
        now = int(time.time())
        meta = FileObject(
            id=new_file_id(),
            bytes=len(content),
            created_at=now,
            filename=filename,
            purpose=purpose,
            expires_at=now + self._retention_s,
        )
        await self._take_place(tenant, meta, quota or _UNLIMITED)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.file(meta.id), _META, meta.model_dump_json())
            pipe.expire(keys.file(meta.id), self._retention_s)
            pipe.set(keys.file_content(meta.id), content, ex=self._retention_s)
            await pipe.execute()
        await record_owner(self._redis, ResourceKind.FILE, meta.id, tenant, self._retention_s)
        return meta

    async def _take_place(self, tenant: str, meta: FileObject, quota: FileQuota) -> None:
        """Reserve ``meta``'s place in the tenant's index and sizes, or raise the 429 saying why not."""
        index, sizes = keys.files_index(tenant), keys.files_usage(tenant)
        args: list[float | int | str] = [
            meta.created_at,
            self._retention_s,
            meta.id,
            meta.bytes,
            quota.max_files,
            quota.max_bytes,
        ]
        refused = await self._reserve(keys=[index, sizes], args=args)
        if len(refused) == 1:
            return
        files, stored, frees_at = (int(value) for value in refused)
        raise QuotaExceeded(
            f"Your files take {files} of {quota.max_files} files and {stored} of {quota.max_bytes} bytes; "
            f"this file ({meta.bytes} bytes) does not fit. Delete files or retry once they expire.",
            retry_after_s=max(1, frees_at - meta.created_at),
        )

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
            pipe.hdel(keys.files_usage(tenant), file_id)
            deleted, *_ = await pipe.execute()
        return int(deleted) > 0
