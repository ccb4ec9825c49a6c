"""Owns ``tokenferry keys create | list | revoke``: API key management straight on Redis.

Torch-free and gateway-free: it needs only the Redis URL the gateways use
(``--redis-url`` or ``TOKENFERRY_REDIS_URL``). ``create`` prints the secret once;
nothing prints a secret or a full hash afterwards, because nothing stores one.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.access import apikeys
from shared.redis_connect import async_client
from shared.redis_url import redacted_url
from shared.settings import GatewaySettings

_COLUMNS = ("ID", "NAME", "TENANT", "KEY", "RPM", "TPM", "ADMIN", "CREATED", "STATUS")


def add_key_commands(commands: Any) -> None:
    parser = commands.add_parser("keys", help="create, list and revoke API keys (stored hashed in Redis)")
    actions = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="make a key and print its secret once")
    create.add_argument("--name", required=True, help="what the key is for (shown in listings)")
    create.add_argument("--rpm", type=_positive, help="requests per minute (default: the gateway's)")
    create.add_argument("--tpm", type=_positive, help="tokens per minute (default: the gateway's)")
    create.add_argument("--admin", action="store_true", help="may also use the /admin endpoints")
    create.add_argument("--tenant", help="owner of what the key creates (default: the key's id)")
    create.set_defaults(handler=_handler(_create))
    listing = actions.add_parser("list", help="every key, without secrets")
    listing.add_argument("--json", action="store_true", help="one JSON object per key")
    listing.set_defaults(handler=_handler(_list))
    revoke = actions.add_parser("revoke", help="revoke a key by its id (takes effect within seconds)")
    revoke.add_argument("key_id", metavar="KEY_ID")
    revoke.set_defaults(handler=_handler(_revoke))
    for action in (create, listing, revoke):
        action.add_argument("--redis-url", help="the gateways' Redis (TOKENFERRY_REDIS_URL)")
        action.add_argument("--config", dest="config_file", metavar="FILE.yaml", help="YAML settings file")


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


Action = Callable[[Redis, argparse.Namespace], Awaitable[int]]


def _handler(action: Action) -> Callable[[argparse.Namespace], int]:
    """A synchronous command handler running ``action`` against the configured Redis."""

    def run(args: argparse.Namespace) -> int:
        names = ("redis_url", "config_file")
        given = {name: getattr(args, name) for name in names if getattr(args, name, None)}
        url = GatewaySettings(**given).redis_url
        try:
            return asyncio.run(_with_redis(url, action, args))
        except RedisError as error:
            print(f"tokenferry keys: cannot use Redis at {redacted_url(url)}: {error}", file=sys.stderr)
            return 1

    return run


async def _with_redis(url: str, action: Action, args: argparse.Namespace) -> int:
    redis = async_client(url, socket_connect_timeout=2)
    try:
        return await action(redis, args)
    finally:
        await redis.aclose()


async def _create(redis: Redis, args: argparse.Namespace) -> int:
    created = await apikeys.create_key(
        redis, args.name, rpm=args.rpm, tpm=args.tpm, is_admin=args.admin, tenant=args.tenant
    )
    print(f"Created key {created.record.key_id} ({args.name}).")
    print("Secret (shown only now; store it safely, it cannot be recovered):")
    print(created.secret)
    return 0


async def _list(redis: Redis, args: argparse.Namespace) -> int:
    records = await apikeys.list_keys(redis)
    if args.json:
        for record in records:
            print(json.dumps(record.model_dump(exclude={"key_hash"})))
        return 0
    rows = [_COLUMNS, *(_row(record) for record in records)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


async def _revoke(redis: Redis, args: argparse.Namespace) -> int:
    try:
        record = await apikeys.revoke_key(redis, args.key_id)
    except apikeys.KeyNotFound:
        print(f"tokenferry keys: no key with id {args.key_id}", file=sys.stderr)
        return 1
    print(f"Revoked key {record.key_id} ({record.name}); gateways refuse it within a few seconds.")
    return 0


def _row(record: apikeys.ApiKeyRecord) -> tuple[str, ...]:
    created = datetime.datetime.fromtimestamp(record.created_at, datetime.UTC).strftime("%Y-%m-%d %H:%M")
    return (
        record.key_id,
        record.name,
        record.tenant,
        record.hint,
        "default" if record.rpm is None else str(record.rpm),
        "default" if record.tpm is None else str(record.tpm),
        "yes" if record.is_admin else "no",
        created,
        "revoked" if record.is_revoked else "active",
    )
