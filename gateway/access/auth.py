"""Owns bearer-key authentication: who is calling (a ``Principal``), or 401.

Keys come from two places: the settings (``api_keys``, ``admin_api_keys``; each a
secret or ``sha256:<hex>``) and Redis (``tokenferry keys create``; see
``shared/access/apikeys.py``). Both are held only as SHA-256 hashes. A presented key is
hashed once; settings keys are compared against every configured hash with
``hmac.compare_digest`` and no early exit, Redis keys are looked up by that hash.

Authentication is on when the settings name a key or Redis holds any key record
(revoked ones included, so revoking the last key does not open the gateway).
With it off every caller is the anonymous principal, which is no admin.

Caching: "does Redis hold any key?" and each found key record are remembered for
``auth_cache_s`` (2 s by default), so a request costs no extra Redis round trip
in the common case. The price is written down: a revoked key keeps working for
at most that long on each gateway, and a gateway notices the first key ever
created within that long. Failed lookups are never cached (a key created a moment
ago must work at once).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from shared.access import apikeys
from shared.errors import Unauthorized

ANONYMOUS_ID = "anonymous"
STATIC_ID_PREFIX = "static_"
# Found records kept at most this many; a full cache is simply cleared (keys in use are few).
_MAX_CACHED_RECORDS = 10_000


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-minute limits of one key; None means unlimited."""

    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: its key's public id, the tenant owning what it creates, and its rights."""

    key_id: str
    tenant: str
    is_admin: bool = False
    limits: Limits = Limits()

    @property
    def is_anonymous(self) -> bool:
        return self.key_id == ANONYMOUS_ID


ANONYMOUS = Principal(key_id=ANONYMOUS_ID, tenant=ANONYMOUS_ID)


@dataclass(frozen=True, slots=True)
class StaticKey:
    """A key from the settings, kept as its hash."""

    key_hash: str
    is_admin: bool

    @property
    def key_id(self) -> str:
        # A public name derived from the hash: stable across restarts, reveals nothing usable.
        return STATIC_ID_PREFIX + self.key_hash[:12]


def static_keys(api_keys: Sequence[str], admin_api_keys: Sequence[str]) -> list[StaticKey]:
    """The settings' keys as hashes; admin entries win when a key is listed twice."""
    admin = [StaticKey(apikeys.configured_hash(entry), is_admin=True) for entry in admin_api_keys]
    admin_hashes = {key.key_hash for key in admin}
    plain = [StaticKey(apikeys.configured_hash(entry), is_admin=False) for entry in api_keys]
    return admin + [key for key in plain if key.key_hash not in admin_hashes]


class Authenticator:
    """Turns an Authorization header into a Principal; one per gateway process."""

    def __init__(
        self,
        redis: Redis,
        static: Sequence[StaticKey],
        defaults: Limits,
        cache_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._static = tuple(static)
        self._defaults = defaults
        self._cache_s = cache_s
        self._clock = clock
        self._has_keys_until = -1.0
        self._has_keys = False
        self._records: dict[str, tuple[float, apikeys.ApiKeyRecord]] = {}

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller's principal; Unauthorized when keys are on and this one is not valid."""
        secret = bearer_secret(authorization)
        if secret is None:
            if await self.is_enabled():
                raise Unauthorized(
                    "You didn't provide an API key. Send it in an Authorization header "
                    "using Bearer auth (Authorization: Bearer YOUR_KEY)."
                )
            return ANONYMOUS
        principal = await self._principal_for(secret)
        if principal is not None:
            return principal
        if await self.is_enabled():
            raise Unauthorized("Incorrect API key provided.")
        return ANONYMOUS

    async def is_enabled(self) -> bool:
        """Whether keys are configured anywhere (cached ``cache_s`` for Redis' answer)."""
        if self._static:
            return True
        now = self._clock()
        if now >= self._has_keys_until:
            self._has_keys = await apikeys.has_any_keys(self._redis)
            self._has_keys_until = now + self._cache_s
        return self._has_keys

    async def _principal_for(self, secret: str) -> Principal | None:
        key_hash = apikeys.hash_secret(secret)
        static = find_static(key_hash, self._static)
        if static is not None:
            return Principal(static.key_id, static.key_id, static.is_admin, self._defaults)
        if not self._static and not await self.is_enabled():
            return None  # no keys anywhere: skip the lookup, the caller is anonymous
        record = await self._record_for(secret, key_hash)
        if record is None:
            return None
        limits = Limits(record.rpm or self._defaults.rpm, record.tpm or self._defaults.tpm)
        return Principal(record.key_id, record.tenant, record.is_admin, limits)

    async def _record_for(self, secret: str, key_hash: str) -> apikeys.ApiKeyRecord | None:
        now = self._clock()
        cached = self._records.get(key_hash)
        if cached is not None and cached[0] > now:
            return cached[1]
        record = await apikeys.find_by_secret(self._redis, secret)
        if record is None:
            self._records.pop(key_hash, None)
            return None
        if len(self._records) >= _MAX_CACHED_RECORDS:
            self._records.clear()
        self._records[key_hash] = (now + self._cache_s, record)
        return record


def bearer_secret(authorization: str | None) -> str | None:
    """The key in ``Authorization: Bearer <key>``, or None for a missing or other scheme."""
    if not authorization:
        return None
    scheme, _, secret = authorization.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        return None
    return secret


def find_static(key_hash: str, static: Sequence[StaticKey]) -> StaticKey | None:
    """The settings key with this hash; every entry is compared, in constant time each."""
    found = None
    for key in static:
        if hmac.compare_digest(key_hash.encode(), key.key_hash.encode()):
            found = key
    return found
