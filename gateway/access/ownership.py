"""Owns ownership at the HTTP edge: recording which tenant created a resource, and 404 for any other.

Handlers that create something fetchable by id call ``claim``; handlers that
serve something by id depend on ``owned(kind, path_param)``, and a service
given an id some other way asks ``Ownership.require``. Someone else's id answers
404, exactly like an id that never existed, so probing ids reveals nothing.
Admins are tenants like any other here: reading another tenant's data is not an
admin power.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from redis.asyncio import Redis

from gateway.access.auth import Principal
from gateway.http.deps import PoolDep, PrincipalDep
from shared.access.ownership import ResourceKind, is_owned_by, record_owner
from shared.errors import NotFound


async def claim(redis: Redis, principal: Principal, kind: ResourceKind, resource_id: str, ttl_s: int) -> None:
    """Record ``principal``'s tenant as the owner of the new ``resource_id``."""
    await record_owner(redis, kind, resource_id, principal.tenant, ttl_s)


async def require_owner(redis: Redis, principal: Principal, kind: ResourceKind, resource_id: str) -> None:
    """Raise 404 unless ``principal``'s tenant created ``resource_id``."""
    if not await is_owned_by(redis, kind, resource_id, principal.tenant):
        raise NotFound(f"No {kind} found with id '{resource_id}'.", param=f"{kind}_id")


def owned(kind: ResourceKind, path_param: str) -> Callable[..., Coroutine[Any, Any, str]]:
    """A dependency giving the path's ``path_param`` once the caller is known to own it (else 404).

    Use as ``request_id: Annotated[str, Depends(owned(ResourceKind.REQUEST, "request_id"))]``.
    """

    async def owned_id(request: Request, pool: PoolDep, principal: PrincipalDep) -> str:
        resource_id = str(request.path_params[path_param])
        await require_owner(pool, principal, kind, resource_id)
        return resource_id

    return owned_id


@dataclass(frozen=True, slots=True)
class Ownership:
    """Ownership checks for one request's caller."""

    redis: Redis
    principal: Principal

    async def require(self, kind: ResourceKind, resource_id: str) -> None:
        """Raise 404 unless the caller's tenant created ``resource_id``."""
        await require_owner(self.redis, self.principal, kind, resource_id)


async def get_ownership(pool: PoolDep, principal: PrincipalDep) -> Ownership:
    return Ownership(pool, principal)


OwnershipDep = Annotated[Ownership, Depends(get_ownership)]
