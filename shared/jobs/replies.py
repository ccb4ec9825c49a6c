"""Owns short request/reply exchanges between gateway and worker (tokenize, detokenize).

The gateway enqueues a job and BLPOPs ``keys.reply(request_id)`` with a timeout;
the worker RPUSHes one JSON reply and arms its TTL in the same pipeline, so a
reply nobody collects (its gateway gave up) expires on its own. A list rather
than a stream: there is exactly one message and one reader, and BLPOP both waits
for it and deletes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import cast

from pydantic import TypeAdapter, ValidationError
from redis.asyncio import Redis

from shared import keys
from shared.errors import Timeout, WorkerFailed
from shared.protocol import TokenizeReply

logger = logging.getLogger(__name__)

_reply_adapter: TypeAdapter[TokenizeReply] = TypeAdapter(TokenizeReply)


async def send_reply(redis: Redis, request_id: str, reply: TokenizeReply) -> None:
    """Store the one reply to ``request_id`` for its gateway to pop."""
    key = keys.reply(request_id)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.rpush(key, reply.model_dump_json())
        pipe.expire(key, keys.REPLY_TTL_S)
        await pipe.execute()


async def await_reply(redis: Redis, request_id: str, timeout_s: float) -> TokenizeReply:
    """The reply to ``request_id``; ``Timeout`` when no worker answered in ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    popped: tuple[bytes, bytes] | None = None
    while popped is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout("no worker answered in time; retry shortly")
        # One-second slices, so the deadline is ours rather than the server's (Redis takes
        # fractional seconds from 6.0; redis-py types the timeout as int for both clients).
        pending = redis.blpop([keys.reply(request_id)], timeout=min(1.0, remaining))  # type: ignore[arg-type]
        popped = await cast("Awaitable[tuple[bytes, bytes] | None]", pending)
    _key, raw = popped
    try:
        return _reply_adapter.validate_json(raw)
    except ValidationError as error:
        # The detail is for the operator (a worker of another version?), never for the client.
        logger.warning("unreadable reply from a worker: %s", error)
        raise WorkerFailed("The worker's answer could not be read; please retry.") from error
