"""Owns the admin API under /admin: managing API keys over HTTP (admin keys only, else 403).

The same operations as ``tokenferry keys`` (``gateway/access/key_admin.py`` does
them): list (never secrets or hashes), create (the secret appears once, in that
response), revoke. A revoked key stops working within the gateways' ``auth_cache_s``.
What an admin may and may not do is written down in ``key_admin.py``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from gateway.access.key_admin import KeyAdminDep
from gateway.http.deps import JsonBody
from shared.access import apikeys

router = APIRouter(prefix="/admin", tags=["admin"])


class KeyInfo(BaseModel):
    """A key as listed: everything but its secret and hash."""

    object: str = "api_key"
    id: str
    name: str
    tenant: str
    hint: str = Field(description="Prefix and last characters of the secret.")
    rpm: int | None
    tpm: int | None
    is_admin: bool
    created_at: int
    is_revoked: bool


class KeyList(BaseModel):
    object: str = "list"
    data: list[KeyInfo]


class NewKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    rpm: int | None = Field(None, gt=0, description="Requests per minute; default: the gateway's.")
    tpm: int | None = Field(None, gt=0, description="Tokens per minute; default: the gateway's.")
    is_admin: bool = False
    tenant: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Default: the key's id (a new tenant); else only the admin's own tenant (403 otherwise).",
    )


class NewKey(KeyInfo):
    secret: str = Field(description="The key itself; shown only in this response.")


def key_info(record: apikeys.ApiKeyRecord) -> KeyInfo:
    return KeyInfo(
        id=record.key_id,
        **record.model_dump(include={"name", "tenant", "hint", "rpm", "tpm", "is_admin", "is_revoked"}),
        created_at=int(record.created_at),
    )


@router.get("/keys", response_model=KeyList)
async def list_keys(key_admin: KeyAdminDep) -> KeyList:
    """Every key, revoked ones included, oldest first."""
    return KeyList(data=[key_info(record) for record in await key_admin.list()])


@router.post("/keys", response_model=NewKey, status_code=201, dependencies=[JsonBody])
async def create_key(body: NewKeyRequest, key_admin: KeyAdminDep) -> NewKey:
    """A new key; its secret is in this response and nowhere else."""
    created = await key_admin.create(
        body.name, rpm=body.rpm, tpm=body.tpm, is_admin=body.is_admin, tenant=body.tenant
    )
    return NewKey(**key_info(created.record).model_dump(), secret=created.secret)


@router.delete("/keys/{key_id}", response_model=KeyInfo)
async def revoke_key(key_id: Annotated[str, Path()], key_admin: KeyAdminDep) -> KeyInfo:
    """Revoke ``key_id`` (kept in the list as revoked); 404 for an unknown id."""
    return key_info(await key_admin.revoke(key_id))
