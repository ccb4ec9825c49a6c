"""Owns batch records in Redis: the batch object, its status changes, its lines' progress and results.

A batch is one hash (``keys.batch``) holding its fixed fields (``spec``, JSON), its
status and timestamps, ``request_counts`` and where the runner is in the file
(``cursor``: lines below it have been started, or refused when due); beside it,
the line numbers done (a set), the lines running (a hash: line -> request id) and
the output and error lines (two lists).

Two things must hold whatever runner (gateway) drives the batch, and however many
think they do after a lease changes hands; both are Lua scripts, so each is one
atomic step:

* status changes are compare-and-set (``transition``, ``gateway/background/status_cas.py``):
  a cancel and the runner's completion race, and exactly one wins;
* a line finishes once (``finish_line``): its number joins the done set, and only
  if it was not there already are its output line appended and its count raised.
  A runner taking over re-reads the streams of the lines it finds running, so a
  line is never lost, and this makes it never written twice either.

Every key expires: ``completion window + retention`` at creation, ``retention``
once the batch ends.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

from redis.asyncio import Redis

from gateway.background.status_cas import StatusCas
from gateway.batches.listing import newest_after
from gateway.batches.schema import (
    TERMINAL_BATCH_STATUSES,
    Batch,
    BatchCreateRequest,
    BatchErrors,
    BatchRequestCounts,
)
from shared import keys
from shared.access.ownership import ResourceKind, record_owner

BATCH_ID_PREFIX = "batch_"
ACTIVE_KIND = "batch"
COMPLETION_WINDOW_S = 24 * 3600
PARTS = ("done", "inflight", "output", "errors")
_TIMESTAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)

# KEYS: done set, batch hash, result list, inflight hash. ARGV: line, result JSON, count field, TTL.
_FINISH_LINE = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[3], ARGV[2])
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
end
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[3], ARGV[4])
return 1
"""


def new_batch_id() -> str:
    return BATCH_ID_PREFIX + secrets.token_hex(16)


class BatchStore:
    """Batch records of all tenants; one per gateway process."""

    def __init__(self, redis: Redis, retention_s: int) -> None:
        self._redis = redis
        self.retention_s = retention_s
        self._status = StatusCas(redis)
        self._finish_line = redis.register_script(_FINISH_LINE)

    async def create(self, tenant: str, request: BatchCreateRequest) -> Batch:
        now = int(time.time())
        batch_id = new_batch_id()
        spec = {
            **request.model_dump(),
            "id": batch_id,
            "created_at": now,
            "expires_at": now + COMPLETION_WINDOW_S,
        }
        ttl = COMPLETION_WINDOW_S + self.retention_s
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                keys.batch(batch_id), mapping={"spec": json.dumps(spec), "status": "validating", "cursor": 0}
            )
            pipe.expire(keys.batch(batch_id), ttl)
            pipe.zadd(keys.batches_index(tenant), {batch_id: now})
            pipe.expire(keys.batches_index(tenant), ttl)
            pipe.sadd(keys.active(ACTIVE_KIND), batch_id)
            await pipe.execute()
        await record_owner(self._redis, ResourceKind.BATCH, batch_id, tenant, ttl)
        batch = await self.get(batch_id)
        assert batch is not None
        return batch

    async def get(self, batch_id: str) -> Batch | None:
        fields = await self._redis.hgetall(keys.batch(batch_id))  # type: ignore[misc]
        return batch_object(_texts(fields)) if fields else None

    async def list(self, tenant: str, *, limit: int, after: str | None) -> tuple[list[Batch], bool]:
        """The tenant's batches, newest first, after the id ``after``; and whether more follow."""
        found: list[Batch] = []
        listed = newest_after(self._redis, keys.batches_index(tenant), after, self.get)
        async with aclosing(listed) as batches:
            async for batch in batches:
                if len(found) == limit:
                    return found, True
                found.append(batch)
        return found, False

    async def transition(self, batch_id: str, to: str, allowed: tuple[str, ...], **fields: str | int) -> bool:
        """Move to status ``to`` (stamping ``{to}_at``) only from one of ``allowed``."""
        stamped = {f"{to}_at": int(time.time()), **fields}
        changed = await self._status.change(keys.batch(batch_id), to, allowed, stamped)
        if changed and to in TERMINAL_BATCH_STATUSES:
            await self._retire(batch_id)
        return bool(changed)

    async def field(self, batch_id: str, name: str) -> str | None:
        value = await self._redis.hget(keys.batch(batch_id), name)  # type: ignore[misc]
        return None if value is None else _text(value)

    async def start_lines(self, batch_id: str, started: dict[int, str], cursor: int) -> None:
        """Record lines as running (line -> request id) and move the cursor to ``cursor``, atomically."""
        async with self._redis.pipeline(transaction=True) as pipe:
            if started:
                pipe.hset(
                    keys.batch_part(batch_id, "inflight"),
                    mapping={str(line): rid for line, rid in started.items()},
                )
                pipe.expire(keys.batch_part(batch_id, "inflight"), COMPLETION_WINDOW_S + self.retention_s)
            pipe.hset(keys.batch(batch_id), "cursor", str(cursor))
            await pipe.execute()

    async def running_lines(self, batch_id: str) -> dict[int, str]:
        raw = await self._redis.hgetall(keys.batch_part(batch_id, "inflight"))  # type: ignore[misc]
        return {int(_text(line)): _text(request_id) for line, request_id in raw.items()}

    async def done_lines(self, batch_id: str) -> set[int]:
        return {int(_text(item)) for item in await self._redis.smembers(keys.batch_part(batch_id, "done"))}  # type: ignore[misc]

    async def finish_line(self, batch_id: str, line: int, result_json: str, *, failed: bool) -> None:
        await self.finish_lines(batch_id, [(line, result_json, failed)])

    async def finish_lines(self, batch_id: str, finished: Sequence[tuple[int, str, bool]]) -> None:
        """Store each (line, result JSON, failed) once, counting it, in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for line, result_json, failed in finished:
                part = "errors" if failed else "output"
                await self._finish_line(
                    keys=[
                        keys.batch_part(batch_id, "done"),
                        keys.batch(batch_id),
                        keys.batch_part(batch_id, part),
                        keys.batch_part(batch_id, "inflight"),
                    ],
                    args=[
                        line,
                        result_json,
                        "failed" if failed else "completed",
                        COMPLETION_WINDOW_S + self.retention_s,
                    ],
                    client=pipe,
                )
            await pipe.execute()

    async def results(self, batch_id: str, part: str) -> bytes:
        """The output (``output``) or error (``errors``) lines so far, as one JSONL document."""
        lines = await self._redis.lrange(keys.batch_part(batch_id, part), 0, -1)  # type: ignore[misc]
        return b"".join(bytes(line) + b"\n" for line in lines)

    async def _retire(self, batch_id: str) -> None:
        """A finished batch: no runner needs it, and all of it expires after the retention time."""
        await self._redis.srem(keys.active(ACTIVE_KIND), batch_id)  # type: ignore[misc]
        await self._redis.expire(keys.batch(batch_id), self.retention_s)
        await self._expire_parts(batch_id, self.retention_s)

    async def _expire_parts(self, batch_id: str, ttl_s: int) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for part in PARTS:
                pipe.expire(keys.batch_part(batch_id, part), ttl_s)
            await pipe.execute()


def batch_object(fields: dict[str, str]) -> Batch:
    """The OpenAI batch object from a batch hash's fields."""
    spec: dict[str, Any] = json.loads(fields["spec"])
    stamps = {name: int(fields[name]) for name in _TIMESTAMPS if name in fields}
    errors = BatchErrors.model_validate_json(fields["errors"]) if "errors" in fields else None
    counts = BatchRequestCounts(
        total=int(fields.get("total", 0)),
        completed=int(fields.get("completed", 0)),
        failed=int(fields.get("failed", 0)),
    )
    return Batch(
        **spec,
        **stamps,
        status=fields["status"],
        model=fields.get("model"),
        errors=errors,
        output_file_id=fields.get("output_file_id"),
        error_file_id=fields.get("error_file_id"),
        request_counts=counts,
    )


def _texts(fields: dict[Any, Any]) -> dict[str, str]:
    return {_text(name): _text(value) for name, value in fields.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
