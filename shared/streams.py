"""Owns the per-request event streams: the worker's pipelined writer and the gateway's reader.

One Redis Stream per request (XADD by the worker, XREAD BLOCK by the gateway).
Streams rather than pub/sub because a late reader loses nothing and any gateway
can resume from an entry id (the SSE ``Last-Event-ID``). All events of one decode
step go out in one pipeline, so a step costs one round trip whatever the batch size.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from shared import keys
from shared.codec import decode_event, encode_event
from shared.errors import Timeout
from shared.protocol import TERMINAL_EVENT_TYPES, TokenEvent

# XREAD blocks at most this long per call so deadlines are checked between calls.
_READ_BLOCK_MS = 1_000


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """An event with the stream entry id it was stored under (the SSE event id)."""

    entry_id: str
    event: TokenEvent


class EventWriter:
    """Publishes events of many requests; one pipelined round trip per call."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def publish_step(self, events: Sequence[tuple[str, TokenEvent]]) -> None:
        """XADD every (request_id, event) pair, arming TTLs, in one pipeline."""
        if not events:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for request_id, event in events:
                stream = keys.events(request_id)
                pipe.xadd(stream, encode_event(event), maxlen=keys.EVENTS_MAXLEN, approximate=True)  # type: ignore[arg-type]
                if event.type in TERMINAL_EVENT_TYPES:
                    pipe.expire(stream, keys.EVENTS_TTL_S)
                elif event.type == "accepted":
                    pipe.expire(stream, keys.EVENTS_RUNNING_TTL_S)
            await pipe.execute()


class EventReader:
    """Reads one request's events in order until its terminal event or a deadline."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def read(
        self, request_id: str, *, deadline: float, after_id: str = "0"
    ) -> AsyncGenerator[StreamEvent, None]:
        """Yield events after ``after_id``; raise ``Timeout`` if ``deadline`` (monotonic) passes."""
        stream = keys.events(request_id)
        last_id = after_id
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise Timeout("the request did not complete before its deadline")
            block_ms = max(1, min(_READ_BLOCK_MS, remaining_ms))
            reply = await self._redis.xread({stream: last_id}, block=block_ms, count=256)
            for _stream, entries in reply or ():
                for raw_id, fields in entries:
                    last_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
                    event = decode_event(fields)
                    yield StreamEvent(last_id, event)
                    if event.type in TERMINAL_EVENT_TYPES:
                        return
