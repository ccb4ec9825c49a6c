"""A Redis failure while a job starts (after its claim) neither fails the request nor strands it."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import keys
from shared.jobs.streams import EventWriter
from shared.protocol import Accepted
from tests.helpers import FAKE_MODEL, chat_body, running_stack


async def test_a_job_whose_start_hits_a_redis_failure_is_handed_on_and_completes(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish = EventWriter.publish_owned
    failed: list[str] = []

    async def fail_first_accepted(self: EventWriter, events: Any, **kwargs: Any) -> Any:
        if not failed and any(isinstance(event, Accepted) for _, event in events):
            failed.append(events[0][0])
            raise RedisConnectionError("Connection closed by server.")  # the claim already happened
        return await publish(self, events, **kwargs)

    monkeypatch.setattr(EventWriter, "publish_owned", fail_first_accepted)
    async with running_stack(redis_url) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
    assert failed, "the failure was never injected"
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 5
    assert not await redis.sismember(keys.running(FAKE_MODEL), failed[0])  # type: ignore[misc]
