"""The shared stream readers hand a relay every event that has arrived at once, and keep their deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from redis.asyncio import Redis

from shared.errors import Timeout
from shared.jobs.stream_mux import WOKEN_BLOCK_MS, StreamMux
from shared.jobs.streams import EventWriter
from shared.protocol import Accepted, Delta, Finished, FinishReason, Usage

USAGE = Usage(prompt_tokens=1, completion_tokens=3)


async def _publish(redis: Redis, request_id: str, texts: list[str], *, finish: bool) -> None:
    events = [(request_id, Accepted(prompt_tokens=1, worker_id="w"))]
    events += [(request_id, Delta(text=text, token_ids=[1])) for text in texts]
    if finish:
        events.append((request_id, Finished(finish_reason=FinishReason.STOP, usage=USAGE)))
    await EventWriter(redis).publish_step(events)


async def test_events_stored_before_the_read_come_as_one_batch_ending_at_the_terminal_one(
    redis: Redis,
) -> None:
    await _publish(redis, "r1", ["a", "b", "c"], finish=True)
    mux = StreamMux(redis, readers=2)
    try:
        batches = [
            [item.event.type for item in batch]
            async for batch in mux.read_batches("r1", deadline=time.monotonic() + 10)
        ]
        flat = [item.event.type async for item in mux.read("r1", deadline=time.monotonic() + 10)]
    finally:
        await mux.aclose()

    assert batches == [["accepted", "delta", "delta", "delta", "finished"]]
    assert flat == batches[0]


async def test_a_deadline_hands_over_what_arrived_then_times_out(redis: Redis) -> None:
    await _publish(redis, "r2", ["a"], finish=False)
    mux = StreamMux(redis, readers=1)
    received: list[str] = []
    try:
        with pytest.raises(Timeout):
            async for batch in mux.read_batches("r2", deadline=time.monotonic() + 0.3):
                received += [item.event.type for item in batch]
    finally:
        await mux.aclose()

    assert received == ["accepted", "delta"]


async def _first_event_after_joining_a_blocked_reader(redis: Redis, mux: StreamMux, request_id: str) -> float:
    """Seconds from publishing to a stream that joined a reader already blocked on another."""
    waiting = asyncio.create_task(_events(mux, f"{request_id}-idle", deadline_s=5))
    await asyncio.sleep(0.2)  # the one reader is now blocked in XREAD on the idle stream
    joined = mux.read_batches(request_id, deadline=time.monotonic() + 10)
    first = asyncio.ensure_future(anext(joined))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    await _publish(redis, request_id, ["a"], finish=True)
    batch = await first
    elapsed = time.monotonic() - started
    await joined.aclose()
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError, Timeout):
        await waiting
    assert batch[0].event.type == "accepted"
    return elapsed


async def _events(mux: StreamMux, request_id: str, deadline_s: float) -> list[str]:
    return [item.event.type async for item in mux.read(request_id, deadline=time.monotonic() + deadline_s)]


async def test_a_stream_joining_a_blocked_reader_is_read_at_once_not_after_the_block(redis: Redis) -> None:
    mux = StreamMux(redis, readers=1)
    try:
        elapsed = await _first_event_after_joining_a_blocked_reader(redis, mux, "r3")
    finally:
        await mux.aclose()
    assert elapsed < WOKEN_BLOCK_MS / 2000  # cut short: well before the block would end


async def test_where_readers_cannot_be_woken_a_joining_stream_waits_only_a_short_block(
    redis_url: str, redis: Redis
) -> None:
    await redis.acl_setuser(
        "no-unblock", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
        commands=["+@all", "-client|unblock"],
    )  # fmt: skip
    limited = Redis.from_url(redis_url, username="no-unblock", password="secret")
    mux = StreamMux(limited, readers=1)
    try:
        elapsed = await _first_event_after_joining_a_blocked_reader(limited, mux, "r4")
    finally:
        await mux.aclose()
        await limited.aclose()
        await redis.acl_deluser("no-unblock")
    assert elapsed < WOKEN_BLOCK_MS / 2000  # the fallback's short blocks, not the long one


async def test_a_relay_joining_where_the_first_event_left_off_is_served_by_the_read_in_flight(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway reads a request's ``accepted`` and then relays the rest from there: the XREAD
    the reader sent after ``accepted`` already reads that stream, so the relay wakes nobody."""
    unblocks: list[int] = []
    unblock = redis.client_unblock

    async def counted(client_id: int, *args: object) -> bool:
        unblocks.append(client_id)
        return await unblock(client_id, *args)

    monkeypatch.setattr(redis, "client_unblock", counted)
    await _publish(redis, "r5", [], finish=False)
    mux = StreamMux(redis, readers=1)
    try:
        async with contextlib.aclosing(mux.read("r5", deadline=time.monotonic() + 10)) as events:
            accepted = await anext(events)
        relay = mux.read_batches("r5", deadline=time.monotonic() + 10, after_id=accepted.entry_id)
        first = asyncio.ensure_future(anext(relay))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await EventWriter(redis).publish_step(
            [
                ("r5", Delta(text="a", token_ids=[1])),
                ("r5", Finished(finish_reason=FinishReason.STOP, usage=USAGE)),
            ]
        )
        received = [item.event.type for item in await asyncio.wait_for(first, timeout=5)]
        elapsed = time.monotonic() - started
        received += [item.event.type async for batch in relay for item in batch]
    finally:
        await mux.aclose()

    assert received == ["delta", "finished"]
    assert elapsed < WOKEN_BLOCK_MS / 2000  # the blocked XREAD returned it, not a later one
    assert len(unblocks) == 1  # the reader's one probe of CLIENT UNBLOCK when it connected
