"""The shared stream readers hand a relay every event that has arrived at once, and keep their deadlines."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

from shared.errors import Timeout
from shared.jobs.stream_mux import StreamMux
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
