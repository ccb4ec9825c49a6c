"""Owns listing a tenant's files or batches: its index newest first, after a cursor id, pruned as it goes.

Each tenant's files and batches are indexed by creation time in a sorted set
(``keys.files_index``, ``keys.batches_index``). An object expires on its own, so
its id may outlive it in the index: a listing that meets such an id drops it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from redis.asyncio import Redis

_T = TypeVar("_T")


class Listed(Protocol):
    @property
    def id(self) -> str: ...


async def newest_after(
    redis: Redis, index: str, after: str | None, load: Callable[[str], Awaitable[_T | None]]
) -> AsyncGenerator[_T, None]:
    """The objects of ``index``, newest first, after the id ``after``; ids whose object expired are pruned."""
    ids = [_text(item) for item in await redis.zrevrange(index, 0, -1)]
    if after is not None and after in ids:
        ids = ids[ids.index(after) + 1 :]
    for object_id in ids:
        found = await load(object_id)
        if found is None:
            await redis.zrem(index, object_id)
        else:
            yield found


def page_ends(page: Sequence[Listed]) -> tuple[str | None, str | None]:
    """A page's ``first_id`` and ``last_id`` (None when it is empty)."""
    return (page[0].id, page[-1].id) if page else (None, None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
