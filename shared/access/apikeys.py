"""Owns API keys: making secrets, hashing them, and their records in Redis.

A secret (``tf-`` + 32 random bytes, URL-safe) is shown once, at creation; Redis
keeps only its SHA-256. A record is found by that hash (``keys.api_key``), and
the stored hash is then compared to the computed one in constant time.

Why SHA-256 and no slow KDF (bcrypt, scrypt, argon2): a slow hash protects
*low-entropy* secrets (passwords) against offline guessing after a leak. Our
secrets carry 256 random bits; nobody can enumerate even 2^128 SHA-256 inputs,
so a leaked hash is as useless as a slow one would be, while a slow KDF would
cost every request milliseconds of CPU and could not be looked up by value.
(GitHub and Stripe hash their random tokens the same way.)

A key's public id (``key_...``) names it in listings, logs, rate limits and
ownership; the secret never appears anywhere after ``create_key`` returns it.
Revoking keeps the record (``revoked`` set), so the index never empties by
revocation: revoking the last key must not turn authentication off.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from shared import keys

SECRET_PREFIX = "tf-"
KEY_ID_PREFIX = "key_"
HASH_PREFIX = "sha256:"
# 32 bytes = 256 bits of entropy: unguessable, and the reason a fast hash is enough.
SECRET_BYTES = 32
_HINT_CHARS = 4


class KeyNotFound(LookupError):
    """No key has this id."""


class ApiKeyRecord(BaseModel):
    """What Redis keeps about one key; never the secret itself."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    name: str
    tenant: str = Field(description="Owner of what this key creates; keys of one tenant share resources.")
    key_hash: str = Field(description="SHA-256 hex of the secret.", repr=False)
    hint: str = Field(description="The secret's prefix and last characters, for recognising it.")
    rpm: int | None = Field(None, description="Requests per minute; None: the gateway default.")
    tpm: int | None = Field(None, description="Tokens per minute; None: the gateway default.")
    is_admin: bool = False
    created_at: float
    is_revoked: bool = False


class CreatedKey(BaseModel):
    """A new key's record and its secret, which exists only in this object."""

    record: ApiKeyRecord
    secret: str = Field(repr=False)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def new_key_id() -> str:
    return KEY_ID_PREFIX + secrets.token_hex(12)


def hash_secret(secret: str) -> str:
    """The SHA-256 hex digest of ``secret``: what is stored and looked up."""
    return hashlib.sha256(secret.encode()).hexdigest()


def hint_of(secret: str) -> str:
    return f"{SECRET_PREFIX}...{secret[-_HINT_CHARS:]}"


def is_same_hash(given: str, stored: str) -> bool:
    return hmac.compare_digest(given.encode(), stored.encode())


def configured_hash(entry: str) -> str:
    """A key from settings as a hash: ``sha256:<hex>`` taken as is, anything else hashed."""
    if entry.startswith(HASH_PREFIX):
        digest = entry.removeprefix(HASH_PREFIX).lower()
        if len(digest) != 64 or any(char not in "0123456789abcdef" for char in digest):
            raise ValueError("a sha256: key entry needs 64 hex digits")
        return digest
    return hash_secret(entry)


async def create_key(
    redis: Redis,
    name: str,
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    is_admin: bool = False,
    tenant: str | None = None,
) -> CreatedKey:
    """Make a key, store its record and index entry in one transaction, return the secret once."""
    secret = new_secret()
    key_id = new_key_id()
    record = ApiKeyRecord(
        key_id=key_id,
        name=name,
        tenant=tenant or key_id,
        key_hash=hash_secret(secret),
        hint=hint_of(secret),
        rpm=rpm,
        tpm=tpm,
        is_admin=is_admin,
        created_at=time.time(),
    )
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.api_key(record.key_hash), mapping=_to_fields(record))
        pipe.hset(keys.api_keys_index(), key_id, record.key_hash)
        await pipe.execute()
    return CreatedKey(record=record, secret=secret)


async def find_by_secret(redis: Redis, secret: str) -> ApiKeyRecord | None:
    """The live (unrevoked) record whose secret is ``secret``, or None."""
    given_hash = hash_secret(secret)
    fields = await redis.hgetall(keys.api_key(given_hash))  # type: ignore[misc]
    if not fields:
        return None
    record = _from_fields(fields)
    # The lookup already matched by hash; comparing again in constant time keeps the
    # decision itself free of any data-dependent timing, whatever the store did.
    if not is_same_hash(given_hash, record.key_hash) or record.is_revoked:
        return None
    return record


async def has_any_keys(redis: Redis) -> bool:
    """Whether any key was ever created (revoked ones count): then authentication is on."""
    return bool(await redis.exists(keys.api_keys_index()))


async def list_keys(redis: Redis) -> list[ApiKeyRecord]:
    """Every key's record, revoked ones included, oldest first; read in one pipeline."""
    hashes = [
        value.decode() if isinstance(value, bytes) else value
        for value in (await redis.hvals(keys.api_keys_index()))  # type: ignore[misc]
    ]
    async with redis.pipeline(transaction=False) as pipe:
        for key_hash in hashes:
            pipe.hgetall(keys.api_key(key_hash))
        rows = await pipe.execute()
    records = [_from_fields(row) for row in rows if row]
    return sorted(records, key=lambda record: record.created_at)


async def revoke_key(redis: Redis, key_id: str) -> ApiKeyRecord:
    """Mark ``key_id`` revoked (kept, so listing shows it); KeyNotFound for an unknown id."""
    key_hash = await redis.hget(keys.api_keys_index(), key_id)  # type: ignore[misc]
    if key_hash is None:
        raise KeyNotFound(key_id)
    record_key = keys.api_key(key_hash.decode() if isinstance(key_hash, bytes) else key_hash)
    await redis.hset(record_key, "is_revoked", "1")  # type: ignore[misc]
    fields = await redis.hgetall(record_key)  # type: ignore[misc]
    return _from_fields(fields)


def _to_fields(record: ApiKeyRecord) -> dict[str, str]:
    """A flat Redis hash: absent limits are empty strings, booleans "0"/"1"."""
    fields: dict[str, str] = {}
    for name, value in record.model_dump().items():
        if value is None:
            fields[name] = ""
        elif isinstance(value, bool):
            fields[name] = "1" if value else "0"
        else:
            fields[name] = str(value)
    return fields


def _from_fields(fields: Mapping[bytes, bytes] | Mapping[str, str]) -> ApiKeyRecord:
    text = {_text(name): _text(value) for name, value in fields.items()}
    values: dict[str, str | None] = {name: (value or None) for name, value in text.items()}
    return ApiKeyRecord.model_validate(values)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
