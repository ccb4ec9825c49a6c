"""Owns who created what: the tenant recorded for each resource id (``keys.owner``).

Anything a key creates and may later fetch by id (a request's event stream, a
file, a batch, a stored response) gets its owner recorded here by its creator,
with a TTL matching the resource's own lifetime. Readers ask ``is_owned_by``; the
gateway answers 404 (never 403) to anyone else, so ids reveal nothing about
whether they exist. Ids themselves must be unguessable (128 random bits or more),
which makes this a second line of defence, not the only one.

Owners are tenants, not keys: a tenant's keys share what it created, so rotating
a key does not orphan its files. A key's tenant is its own id unless it was
created with one (``tokenferry keys create --tenant``).
"""

from __future__ import annotations

import hmac
from enum import StrEnum

from redis.asyncio import Redis

from shared import keys


class ResourceKind(StrEnum):
    REQUEST = "request"
    FILE = "file"
    BATCH = "batch"
    RESPONSE = "response"


async def record_owner(redis: Redis, kind: ResourceKind, resource_id: str, tenant: str, ttl_s: int) -> None:
    """Remember that ``tenant`` created ``resource_id``; forgotten after ``ttl_s``."""
    await redis.set(keys.owner(kind, resource_id), tenant, ex=ttl_s)


async def owner_of(redis: Redis, kind: ResourceKind, resource_id: str) -> str | None:
    """The tenant that created ``resource_id``, or None when unknown or expired."""
    owner = await redis.get(keys.owner(kind, resource_id))
    if owner is None:
        return None
    return owner.decode() if isinstance(owner, bytes) else str(owner)


async def is_owned_by(redis: Redis, kind: ResourceKind, resource_id: str, tenant: str) -> bool:
    """Whether ``tenant`` created ``resource_id``; unknown ids belong to nobody."""
    owner = await owner_of(redis, kind, resource_id)
    return owner is not None and hmac.compare_digest(owner.encode(), tenant.encode())
