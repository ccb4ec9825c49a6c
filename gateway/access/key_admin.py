"""Owns managing API key records for the admin API: list, create, revoke (an admin's key only, else 403).

The records are ``shared/access/apikeys.py``'s; this is their use by the admin
routes (``gateway/access/routes.py``), the same operations as ``tokenferry keys``.

An admin's powers over HTTP, all of them:

- list every key (names, tenants, hints; never secrets or hashes);
- create a key in a new tenant of its own (the default: the key's id) or in the
  admin's own tenant, admin or not;
- revoke any key.

Not an admin power: anything that reaches another tenant's data. Admins are
tenants like any other for ownership (``gateway/access/ownership.py``), and a key
minted inside another tenant would read that tenant's files, batches and streams,
so naming another tenant answers 403. Adding a key to an existing tenant is the
operator's, through ``tokenferry keys create --tenant``, which needs Redis itself.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends
from redis.asyncio import Redis

from gateway.access.auth import Principal
from gateway.http.deps import AdminDep, PoolDep
from shared.access import apikeys
from shared.errors import NotFound, PermissionDenied


class KeyAdmin:
    """API key records as ``admin`` manages them over HTTP."""

    def __init__(self, redis: Redis, admin: Principal) -> None:
        self._redis = redis
        self._admin = admin

    async def list(self) -> list[apikeys.ApiKeyRecord]:
        """Every key, revoked ones included, oldest first."""
        return await apikeys.list_keys(self._redis)

    async def create(
        self, name: str, *, rpm: int | None, tpm: int | None, is_admin: bool, tenant: str | None
    ) -> apikeys.CreatedKey:
        """A new key; its secret is in the result and nowhere else.

        ``tenant`` may only be the admin's own (403 otherwise); None makes the key a tenant of its own.
        """
        if tenant is not None and not hmac.compare_digest(tenant.encode(), self._admin.tenant.encode()):
            raise PermissionDenied(
                "An admin key may create keys only in its own tenant or in a new one (leave `tenant` out).",
                param="tenant",
            )
        return await apikeys.create_key(self._redis, name, rpm=rpm, tpm=tpm, is_admin=is_admin, tenant=tenant)

    async def revoke(self, key_id: str) -> apikeys.ApiKeyRecord:
        """Revoke ``key_id`` (kept in the list as revoked); 404 for an unknown id."""
        try:
            return await apikeys.revoke_key(self._redis, key_id)
        except apikeys.KeyNotFound as error:
            raise NotFound(f"No API key found with id '{key_id}'.", param="key_id") from error


async def get_key_admin(admin: AdminDep, pool: PoolDep) -> KeyAdmin:
    """Key management, for admins only (403 for any other caller)."""
    return KeyAdmin(pool, admin)


KeyAdminDep = Annotated[KeyAdmin, Depends(get_key_admin)]
