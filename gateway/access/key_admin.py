"""Owns managing API key records for the admin API: list, create, revoke (an admin's key only, else 403).

The records are ``shared/access/apikeys.py``'s; this is their use by the admin
routes (``gateway/access/routes.py``), the same operations as ``tokenferry keys``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from redis.asyncio import Redis

from gateway.http.deps import AdminDep, PoolDep
from shared.access import apikeys
from shared.errors import NotFound


class KeyAdmin:
    """API key records as an admin manages them over HTTP."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def list(self) -> list[apikeys.ApiKeyRecord]:
        """Every key, revoked ones included, oldest first."""
        return await apikeys.list_keys(self._redis)

    async def create(
        self, name: str, *, rpm: int | None, tpm: int | None, is_admin: bool, tenant: str | None
    ) -> apikeys.CreatedKey:
        """A new key; its secret is in the result and nowhere else."""
        return await apikeys.create_key(self._redis, name, rpm=rpm, tpm=tpm, is_admin=is_admin, tenant=tenant)

    async def revoke(self, key_id: str) -> apikeys.ApiKeyRecord:
        """Revoke ``key_id`` (kept in the list as revoked); 404 for an unknown id."""
        try:
            return await apikeys.revoke_key(self._redis, key_id)
        except apikeys.KeyNotFound as error:
            raise NotFound(f"No API key found with id '{key_id}'.", param="key_id") from error


async def get_key_admin(admin: AdminDep, pool: PoolDep) -> KeyAdmin:
    """Key management, for admins only (403 for any other caller)."""
    return KeyAdmin(pool)


KeyAdminDep = Annotated[KeyAdmin, Depends(get_key_admin)]
