"""Owns the per-request event streams: the worker's pipelined writer and the gateway's reader.

One Redis Stream per request (XADD by the worker, XREAD BLOCK by the gateway).
Streams rather than pub/sub because a late reader loses nothing and any gateway
can resume from an entry id (the SSE ``Last-Event-ID``). All events of one decode
step go out in one round trip whatever the batch size: a pipeline for events that
belong to no running job (a rejection before acceptance), otherwise one Lua script
that stores each event only while the publishing worker still owns the job
(``shared/jobs/run_records.py``) and deletes the job's run record with its terminal event.

A publish retried after a lost reply (Redis restarted after running the script, before
answering) must not store its events twice: a stream once showed "The quick bbrown
fox". So each owned publish carries a number (``EventWriter.next_publish``), taken
once and kept across its retries, and the script stores a request's events only when
its run record has not seen that number from that owner yet.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared import keys
from shared.codec import EVENT_FIELD, decode_event, encode_event
from shared.errors import Timeout, Unavailable
from shared.protocol import TERMINAL_EVENT_TYPES, TokenEvent

# XREAD blocks at most this long per call so deadlines are checked between calls.
_READ_BLOCK_MS = 1_000
_OUTAGE_RETRY_S = 0.25

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """An event with the stream entry id it was stored under (the SSE event id)."""

    entry_id: str
    event: TokenEvent


# KEYS: per event its stream then its run record. ARGV: maxlen, the two TTLs, the model's
# running set, the publish's number (0: none), then per event its request id, owner token,
# JSON and kind ("t" terminal, "a" accepted, "d" other). A run record keeps, per owner, the
# last number it stored events of; a retried publish finds its own there and stores nothing.
_FENCED_PUBLISH = """
local maxlen, running_ttl, done_ttl, running_set = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local number = tonumber(ARGV[5])
local lost, fresh = {}, {}
for i = 1, #KEYS / 2 do
  local stream, run = KEYS[2 * i - 1], KEYS[2 * i]
  local request_id, owner, event, kind = ARGV[4 * i + 2], ARGV[4 * i + 3], ARGV[4 * i + 4], ARGV[4 * i + 5]
  if redis.call('HGET', run, 'owner') ~= owner then
    lost[#lost + 1] = request_id
  elseif number > 0 and not fresh[run] and tonumber(redis.call('HGET', run, 'n:' .. owner) or '0') >= number
  then
    -- stored already: this publish is a retry
  else
    if number > 0 then
      fresh[run] = true
      redis.call('HSET', run, 'n:' .. owner, number)
    end
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'e', event)
    if kind == 't' then
      redis.call('EXPIRE', stream, done_ttl)
      redis.call('DEL', run)
      redis.call('SREM', running_set, request_id)
    elseif kind == 'a' then
      redis.call('EXPIRE', stream, running_ttl)
    end
  end
end
return lost
"""


# The 1-based positions of the streams in KEYS whose last event is terminal: which of many
# requests have ended, in one command. A stored event is pydantic's compact JSON of it
# (``shared.codec.encode_event``), so its type reads ``"type":"<type>"`` (ARGV); inside a
# string value those quotes would be escaped, so text cannot fake it.
_ENDED = """
local ended = {}
for i, stream in ipairs(KEYS) do
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if last then
    local event = last[2][2]
    for _, marker in ipairs(ARGV) do
      if string.find(event, marker, 1, true) then
        ended[#ended + 1] = i
        break
      end
    end
  end
end
return ended
"""
_TERMINAL_MARKERS = sorted(
    json.dumps({"type": kind}, separators=(",", ":"))[1:-1] for kind in TERMINAL_EVENT_TYPES
)


async def ended_requests(redis: Redis, request_ids: Sequence[str]) -> set[str]:
    """Those of ``request_ids`` whose event stream ends with a terminal event (one round trip)."""
    if not request_ids:
        return set()
    positions = await redis.eval(  # type: ignore[misc]
        _ENDED, len(request_ids), *[keys.events(request_id) for request_id in request_ids], *_TERMINAL_MARKERS
    )
    return {request_ids[int(position) - 1] for position in positions}


class EventWriter:
    """Publishes events of many requests; one round trip per call."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._fenced = redis.register_script(_FENCED_PUBLISH)
        self._publishes = itertools.count(1)

    def next_publish(self) -> int:
        """A number for one owned publish, to pass to every try of it (see the module docstring)."""
        return next(self._publishes)

    async def publish_owned(
        self,
        events: Sequence[tuple[str, TokenEvent]],
        *,
        owners: Mapping[str, str],
        model: str,
        number: int = 0,
    ) -> set[str]:
        """Store events of running jobs, each only while ``owners[request_id]`` still owns it, and
        (with a ``number`` from ``next_publish``) only once however often this publish is retried.

        Returns the request ids whose events were refused: their job was taken over.
        """
        if not events:
            return set()
        stream_keys: list[str] = []
        args: list[str | int] = [keys.EVENTS_MAXLEN, keys.EVENTS_RUNNING_TTL_S, keys.EVENTS_TTL_S]
        args += [keys.running(model), number]
        for request_id, event in events:
            stream_keys += [keys.events(request_id), keys.run(request_id)]
            args += [request_id, owners[request_id], encode_event(event)[EVENT_FIELD], _kind(event)]
        lost = await self._fenced(keys=stream_keys, args=args)
        return {item.decode() if isinstance(item, bytes) else str(item) for item in lost}

    async def publish_step(self, events: Sequence[tuple[str, TokenEvent]]) -> None:
        """XADD every (request_id, event) pair of jobs nobody owns, arming TTLs, in one pipeline."""
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


def _kind(event: TokenEvent) -> str:
    if event.type in TERMINAL_EVENT_TYPES:
        return "t"
    return "a" if event.type == "accepted" else "d"


class EventReader:
    """Reads one request's events in order until its terminal event or a deadline.

    A Redis outage shorter than ``outage_tolerance_s`` only pauses the stream: the
    worker retries its publishing too, so nothing is lost when Redis comes back.
    """

    def __init__(self, redis: Redis, *, outage_tolerance_s: float = 30.0) -> None:
        self._redis = redis
        self._outage_tolerance_s = outage_tolerance_s

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
            reply = await self._xread(stream, last_id, block_ms)
            for _stream, entries in reply or ():
                for raw_id, fields in entries:
                    last_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
                    event = decode_event(fields)
                    yield StreamEvent(last_id, event)
                    if event.type in TERMINAL_EVENT_TYPES:
                        return

    async def history(self, request_id: str) -> list[StreamEvent]:
        """Every event stored so far for ``request_id``, oldest first."""
        return _stream_events(await self._redis.xrange(keys.events(request_id)))

    async def histories(self, request_ids: Sequence[str]) -> list[list[StreamEvent]]:
        """``history`` of each of ``request_ids``, in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.xrange(keys.events(request_id))
            replies = await pipe.execute()
        return [_stream_events(entries) for entries in replies]

    async def _xread(self, stream: str, last_id: str, block_ms: int) -> Any:
        outage_started: float | None = None
        while True:
            if _being_cancelled():
                # redis-py can swallow a cancellation that lands mid-read (with a socket timeout
                # set); looping on would keep the job running for a client that left.
                raise asyncio.CancelledError
            try:
                return await self._redis.xread({stream: last_id}, block=block_ms, count=256)
            except (RedisConnectionError, RedisTimeoutError) as error:
                if _being_cancelled():
                    raise asyncio.CancelledError from error
                now = time.monotonic()
                outage_started = outage_started or now
                if now - outage_started > self._outage_tolerance_s:
                    # The detail (an address, say) is for the log, not for a client.
                    logger.warning("gave up reading %s through a Redis outage: %s", stream, error)
                    raise Unavailable("The service lost its queue connection; please retry.") from error
                await asyncio.sleep(_OUTAGE_RETRY_S)


def _stream_events(entries: Any) -> list[StreamEvent]:
    return [
        StreamEvent(raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id), decode_event(fields))
        for raw_id, fields in entries
    ]


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
