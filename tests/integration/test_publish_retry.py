"""A publish retried after its reply was lost stores its events once: no token twice in a stream."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import keys
from shared.jobs.streams import EventWriter
from shared.protocol import Delta
from tests.helpers import chat_body, running_stack


async def _texts(redis: Redis, request_id: str) -> list[str]:
    entries = await redis.xrange(keys.events(request_id))
    return [fields[b"e"].decode() for _, fields in entries]


async def test_the_same_publish_twice_stores_its_events_once_and_the_next_one_too(redis: Redis) -> None:
    writer = EventWriter(redis)
    await redis.hset(keys.run("r"), mapping={"owner": "w/0"})  # type: ignore[misc]
    owners = {"r": "w/0"}
    first = [("r", Delta(text="The", token_ids=[1])), ("r", Delta(text=" quick", token_ids=[2]))]
    number = writer.next_publish()
    for _ in range(2):  # the second is a retry whose first try ran on Redis
        assert await writer.publish_owned(first, owners=owners, model="m", number=number) == set()
    await writer.publish_owned(
        [("r", Delta(text=" brown", token_ids=[3]))], owners=owners, model="m", number=writer.next_publish()
    )
    texts = await _texts(redis, "r")
    assert len(texts) == 3 and '" brown"' in texts[2]


async def test_a_new_owner_publishes_whatever_numbers_the_old_one_reached(redis: Redis) -> None:
    old, new = EventWriter(redis), EventWriter(redis)
    await redis.hset(keys.run("r"), mapping={"owner": "w/0"})  # type: ignore[misc]
    for _ in range(3):
        await old.publish_owned([("r", Delta(text="a", token_ids=[1]))], owners={"r": "w/0"}, model="m",
                                number=old.next_publish())  # fmt: skip
    await redis.hset(keys.run("r"), mapping={"owner": "v/1"})  # type: ignore[misc]  # taken over
    refused = await old.publish_owned(
        [("r", Delta(text="b", token_ids=[2]))], owners={"r": "w/0"}, model="m", number=old.next_publish()
    )
    assert refused == {"r"}
    await new.publish_owned([("r", Delta(text="c", token_ids=[3]))], owners={"r": "v/1"}, model="m",
                            number=new.next_publish())  # fmt: skip
    assert len(await _texts(redis, "r")) == 4


async def test_a_step_whose_publish_reply_is_lost_streams_every_token_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish = EventWriter.publish_owned
    lost_replies: list[int] = []

    async def lose_one_reply(self: EventWriter, events: Any, **kwargs: Any) -> Any:
        refused = await publish(self, events, **kwargs)
        if not lost_replies and any(isinstance(event, Delta) for _, event in events):
            lost_replies.append(kwargs["number"])
            raise RedisConnectionError("Connection closed by server.")  # after the script ran
        return refused

    async with running_stack(redis_url) as client:
        expected = (await client.post("/v1/completions", json=_completion(8))).json()["choices"][0]["text"]
        monkeypatch.setattr(EventWriter, "publish_owned", lose_one_reply)
        response = await client.post("/v1/completions", json=_completion(8))
    assert lost_replies, "the failure was never injected"
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == expected
    assert response.json()["usage"]["completion_tokens"] == 8


def _completion(max_tokens: int) -> dict[str, Any]:
    body = chat_body(max_tokens=max_tokens)
    return {"model": body["model"], "prompt": "Once upon a time", "max_tokens": max_tokens, "seed": 1}
