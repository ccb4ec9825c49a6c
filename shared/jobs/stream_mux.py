"""Owns the gateway's shared stream readers: every relayed event stream read over a few connections.

A stream read on its own holds a connection blocked in ``XREAD`` for its whole life, so
each open SSE stream cost Redis a client (60 streams took Redis from 17 to 76). Here a
fixed number of readers each own one connection and issue one ``XREAD BLOCK`` over all
the streams given to them (XREAD takes many keys), handing each entry to its
subscriber's buffer. A stream joins the reader that already reads it, else the least
loaded one. A blocked XREAD does not see streams that joined after it was sent, so the
reader re-issues XREAD with its current streams each time it returns, and a join cuts
the XREAD in flight short with ``CLIENT UNBLOCK`` (from the gateway's pool). Without
that, a new stream would wait out the block, and Redis ends blocks only on its ~100 ms
ticks (``hz`` 10), whatever the block asked (measured in ``bench/stream_clients.py``);
where ``CLIENT UNBLOCK`` is not allowed, that is the fallback (``BLOCK_MS``). Where it is,
a block lasts ``WOKEN_BLOCK_MS``: between tokens a reader waits in one XREAD, not many.

Per subscriber the order, the resume point (``after_id``, the SSE ``Last-Event-ID``),
the end at the terminal event and the deadline are those of ``EventReader.read``. A
subscriber that does not keep up stops being read past ``_HIGH_WATER`` buffered events
(its stream is read again from where it is once it drains), so a slow client never
makes the gateway hold more than that. A Redis outage pauses every stream; one longer
than ``outage_tolerance_s`` fails the streams then open with ``Unavailable``.

``read_batches`` hands a subscriber everything buffered for it at once, so a relay that
fell behind writes several events in one SSE write instead of paying a send per event
(the gateway's largest cost per token, measured in ``bench/scale``); ``read`` is the same
one event at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Collection
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared import keys
from shared.codec import decode_event
from shared.errors import Timeout, Unavailable
from shared.jobs.streams import StreamEvent
from shared.protocol import TERMINAL_EVENT_TYPES
from shared.redis_connect import dedicated_client

logger = logging.getLogger(__name__)

# How long one XREAD blocks: with Redis's ~100 ms ticks, any block under 100 ms ends on the
# next tick, which bounds how late a stream joining a reader is first read if it cannot be woken.
BLOCK_MS = 50
# How long one XREAD blocks where a join can cut it short (CLIENT UNBLOCK allowed). Between two
# decode steps each short block ran out on a tick and was sent again: at 64 streams of ~4 steps
# a second, 4 readers sent 60 XREADs a second where 17 carry tokens, each a wake-up of the
# gateway and Redis on cores the engine computes on.
WOKEN_BLOCK_MS = 1000
# Entries read per stream per XREAD.
_COUNT = 256
# A subscriber with this many events buffered is not read until it has consumed half of them.
_HIGH_WATER = 1024
_OUTAGE_RETRY_S = 0.25
# The readers' connections carry this name (CLIENT LIST shows it).
READER_CLIENT_NAME = "tokenferry-stream-reader"


def _position(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("ms-seq", or "0") as a comparable pair."""
    millis, _, sequence = entry_id.partition("-")
    return int(millis), int(sequence or 0)


@dataclass(eq=False)
class _Subscription:
    """One reader's interest in one stream from ``last_id`` on, and what it has not consumed yet."""

    stream: str
    last_id: str
    entries: deque[StreamEvent] = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    error: Exception | None = None
    ended: bool = False  # its terminal event was handed over: nothing more to read
    paused: bool = False  # too much buffered: not read until it drains

    @property
    def wants_more(self) -> bool:
        return not (self.ended or self.paused or self.error is not None)

    def take(self, entry_id: str, fields: Any) -> None:
        try:
            event = StreamEvent(entry_id, decode_event(fields))
        except Exception as error:  # a malformed entry fails its own stream, never the reader
            self.fail(error)
            return
        self.entries.append(event)
        self.last_id = entry_id
        self.ended = event.event.type in TERMINAL_EVENT_TYPES
        self.paused = len(self.entries) >= _HIGH_WATER
        self.ready.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.ready.set()

    def expire(self) -> None:
        """The read's deadline passed: what is buffered is still handed over, then ``Timeout``."""
        if self.error is None:
            self.fail(Timeout("the request did not complete before its deadline"))


class _Reader:
    """One connection's worth of streams: one XREAD over all of them at a time."""

    def __init__(self, redis: Redis, waker: Redis, outage_tolerance_s: float) -> None:
        self.redis = redis  # this reader's own client, over one connection
        self._waker = waker  # the gateway's pool: cuts a blocked XREAD short
        self._outage_tolerance_s = outage_tolerance_s
        self.subscriptions: dict[str, list[_Subscription]] = {}
        self.changed = asyncio.Event()  # a stream joined, or a paused subscriber drained
        self.task: asyncio.Task[None] | None = None
        self._client_id: int | None = None  # its connection's CLIENT ID, for CLIENT UNBLOCK
        self._changes = 0  # counts joins; ``_read_changes`` is the count the XREAD in flight saw
        self._read_changes = 0
        self._blocked = False
        self._in_flight: dict[str, str] = {}  # the blocked XREAD's positions
        self._waking: asyncio.Task[None] | None = None
        self._can_wake = True

    @property
    def load(self) -> int:
        return sum(len(subscriptions) for subscriptions in self.subscriptions.values())

    def add(self, subscription: _Subscription) -> None:
        self.subscriptions.setdefault(subscription.stream, []).append(subscription)
        if not self._reads_already(subscription):
            self.resume()

    def _reads_already(self, subscription: _Subscription) -> bool:
        """Whether the XREAD in flight reads ``subscription``'s stream from its position or before.

        A request's relay joins where the read of its first event (``accepted``) left off, while
        that read's next XREAD is still blocked on the stream: what it returns is handed to the
        relay, so cutting it short with ``CLIENT UNBLOCK`` would cost both processes a round
        trip and a wake-up per request for nothing.
        """
        position = self._in_flight.get(subscription.stream) if self._blocked else None
        return position is not None and _position(position) <= _position(subscription.last_id)

    def resume(self) -> None:
        """Read again with the current streams: at once if idle, and cut short a blocked XREAD."""
        self._changes += 1
        self.changed.set()
        self._wake()

    def remove(self, subscription: _Subscription) -> None:
        subscriptions = self.subscriptions.get(subscription.stream, [])
        if subscription in subscriptions:
            subscriptions.remove(subscription)
        if not subscriptions:
            self.subscriptions.pop(subscription.stream, None)

    async def run(self) -> None:
        outage_started: float | None = None
        while True:
            positions = self._positions()
            if not positions:
                self.changed.clear()
                await self.changed.wait()
                continue
            try:
                reply = await self._read(positions)
            except (RedisConnectionError, RedisTimeoutError) as error:
                self._client_id = None  # a new connection has a new id
                outage_started = outage_started or time.monotonic()
                if time.monotonic() - outage_started > self._outage_tolerance_s:
                    logger.warning("stream reads failed for %.0f s: %s", self._outage_tolerance_s, error)
                    self._fail_all(Unavailable("The service lost its connection to Redis; please retry."))
                    outage_started = None
                await asyncio.sleep(_OUTAGE_RETRY_S)
                continue
            except RedisError as error:  # a reply error (a key that is no stream): fail its readers
                self._fail_all(error, positions)
                continue
            outage_started = None
            self._dispatch(positions, reply or ())

    async def _read(self, positions: dict[str, str]) -> Any:
        if self._client_id is None:
            self._client_id = int(await self.redis.client_id())
            await self._probe_wake(self._client_id)
        self._read_changes = self._changes
        self._blocked, self._in_flight = True, positions
        block = WOKEN_BLOCK_MS if self._can_wake else BLOCK_MS
        try:
            return await self.redis.xread(positions, block=block, count=_COUNT)  # type: ignore[arg-type]
        finally:
            self._blocked = False

    def _wake(self) -> None:
        """CLIENT UNBLOCK the XREAD in flight if it misses a change: a stream that joined after
        it was sent would otherwise wait out its block (Redis ends blocks on its ~100 ms ticks)."""
        stale = self._blocked and self._read_changes != self._changes
        if stale and self._can_wake and self._waking is None and self._client_id is not None:
            self._waking = asyncio.get_running_loop().create_task(self._unblock(self._client_id))

    async def _probe_wake(self, client_id: int) -> None:
        """Whether this connection's reads can be cut short: CLIENT UNBLOCK of a connection that is
        not blocked answers 0 where it is allowed (before the first long block relies on it)."""
        try:
            await self._waker.client_unblock(client_id)
        except ResponseError as error:
            logger.info("stream readers cannot be woken (%s); new streams wait up to a block", error)
            self._can_wake = False

    async def _unblock(self, client_id: int) -> None:
        try:
            if not await self._waker.client_unblock(client_id):
                await asyncio.sleep(0.001)  # the XREAD has not reached Redis yet: try again
        except ResponseError as error:  # CLIENT UNBLOCK not allowed here: blocks run out instead
            logger.info("stream readers cannot be woken (%s); new streams wait up to a block", error)
            self._can_wake = False
        except RedisError:
            pass  # an outage: the reader's own read fails and re-reads with every stream
        finally:
            self._waking = None
        self._wake()

    async def aclose(self) -> None:
        for task in (self.task, self._waking):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()

    def _positions(self) -> dict[str, str]:
        """Per stream, the oldest position a subscriber that wants more has reached."""
        positions: dict[str, str] = {}
        for stream, subscriptions in self.subscriptions.items():
            wanting = [item.last_id for item in subscriptions if item.wants_more]
            if wanting:
                positions[stream] = min(wanting, key=_position)
        return positions

    def _dispatch(self, positions: dict[str, str], reply: Any) -> None:
        for raw_stream, entries in reply:
            stream = raw_stream.decode() if isinstance(raw_stream, bytes) else str(raw_stream)
            read_from = _position(positions[stream])
            # Only subscribers at or past the read position: one left behind (it was paused)
            # would miss the entries between, so it is read from its own position next time.
            subscribers = [
                item
                for item in self.subscriptions.get(stream, ())
                if not item.ended and item.error is None and _position(item.last_id) >= read_from
            ]
            for raw_id, fields in entries:
                entry_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
                for item in subscribers:
                    if not item.ended and _position(entry_id) > _position(item.last_id):
                        item.take(entry_id, fields)

    def _fail_all(self, error: Exception, streams: Collection[str] | None = None) -> None:
        for stream, subscriptions in self.subscriptions.items():
            if streams is not None and stream not in streams:
                continue
            for item in subscriptions:
                if not item.ended:
                    item.fail(error)


class StreamMux:
    """Reads many requests' event streams over ``readers`` connections; one per gateway process.

    Its connections are its own, opened with the settings of ``redis`` (the gateway's pool)
    when the first stream is read.
    """

    def __init__(self, redis: Redis, *, readers: int = 4, outage_tolerance_s: float = 30.0) -> None:
        self._redis = redis
        self._reader_count = readers
        self._outage_tolerance_s = outage_tolerance_s
        self._readers: list[_Reader] = []

    async def read(
        self, request_id: str, *, deadline: float, after_id: str = "0"
    ) -> AsyncGenerator[StreamEvent, None]:
        """Yield events after ``after_id``; raise ``Timeout`` if ``deadline`` (monotonic) passes."""
        async with aclosing(self.read_batches(request_id, deadline=deadline, after_id=after_id)) as batches:
            async for batch in batches:
                for item in batch:
                    yield item

    async def read_batches(
        self, request_id: str, *, deadline: float, after_id: str = "0"
    ) -> AsyncGenerator[list[StreamEvent], None]:
        """``read``'s events, each time as all of them that are buffered: a relay writes them at once.

        A batch holds at most ``_HIGH_WATER`` events and ends at the terminal one.
        """
        subscription = _Subscription(keys.events(request_id), after_id)
        reader = self._reader_for(subscription.stream)
        reader.add(subscription)
        # One timer for the whole read: an ``asyncio.timeout`` per wait cost a timer per event.
        loop = asyncio.get_running_loop()
        expiry = loop.call_at(loop.time() + deadline - time.monotonic(), subscription.expire)
        try:
            while True:
                if subscription.entries:
                    batch = _take_through_terminal(subscription.entries)
                    if subscription.paused:
                        subscription.paused = False
                        reader.resume()
                    yield batch
                    if batch[-1].event.type in TERMINAL_EVENT_TYPES:
                        return
                    continue
                if subscription.error is not None:
                    raise subscription.error
                await subscription.ready.wait()
                subscription.ready.clear()
        finally:
            expiry.cancel()
            reader.remove(subscription)

    async def aclose(self) -> None:
        """Stop the readers and close their connections."""
        readers, self._readers = self._readers, []
        for reader in readers:
            await reader.aclose()

    def _reader_for(self, stream: str) -> _Reader:
        if not self._readers:
            self._start()
        for reader in self._readers:
            if stream in reader.subscriptions:
                return reader  # one XREAD position serves every subscriber of a stream
        return min(self._readers, key=lambda reader: reader.load)

    def _start(self) -> None:
        for _ in range(self._reader_count):
            reader = _Reader(
                dedicated_client(self._redis, READER_CLIENT_NAME), self._redis, self._outage_tolerance_s
            )
            reader.task = asyncio.get_running_loop().create_task(reader.run())
            self._readers.append(reader)


def _take_through_terminal(entries: deque[StreamEvent]) -> list[StreamEvent]:
    """Pop every buffered event, or those up to the first terminal one."""
    batch: list[StreamEvent] = []
    while entries:
        item = entries.popleft()
        batch.append(item)
        if item.event.type in TERMINAL_EVENT_TYPES:
            break
    return batch
