"""Redis stays bounded: the abort set keeps only recent aborts of live jobs, open streams share a
few reading connections, and the gateway's pool has a limit past which requests get 503."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis

from shared import keys
from shared.codec import decode_job
from shared.jobs import jobqueue
from shared.jobs.stream_mux import READER_CLIENT_NAME
from shared.jobs.streams import EventWriter
from shared.protocol import Accepted, Delta, Finished, FinishReason, Usage
from tests.helpers import arq_stand_in
from tests.integration.test_gateway import (
    MODEL,
    StandInWorker,
    announce,
    chat_body,
    gateway,
    parse_sse,
    replies,
    running_worker,
    stack,
)

STREAMS = 50
READERS = 2
WORDS = ["one", " two", " three", " four"]


class HeldStreams:
    """A stand-in worker whose jobs stream their first word, then wait for ``release`` to finish."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.all_started = asyncio.Event()

    async def generate(self, ctx: dict[str, Any], payload: dict[str, Any]) -> None:
        job = decode_job(payload)
        writer = EventWriter(ctx["redis"])
        await writer.publish_step([(job.request_id, Accepted(prompt_tokens=1, worker_id="w-1"))])
        await writer.publish_step([(job.request_id, Delta(text=WORDS[0], token_ids=[0]))])
        self.started += 1
        if self.started == STREAMS:
            self.all_started.set()
        await self.release.wait()
        for index, word in enumerate(WORDS[1:], start=1):
            await writer.publish_step([(job.request_id, Delta(text=word, token_ids=[index]))])
        usage = Usage(prompt_tokens=1, completion_tokens=len(WORDS))
        await writer.publish_step([(job.request_id, Finished(finish_reason=FinishReason.STOP, usage=usage))])


@contextlib.asynccontextmanager
async def held_worker(redis_url: str, stand_in: HeldStreams) -> AsyncIterator[None]:
    pool = await jobqueue.open_pool(redis_url)
    await announce(pool)
    async with arq_stand_in(pool, stand_in.generate, MODEL, max_jobs=STREAMS * 2):
        yield


async def until_queued(redis: Redis) -> None:
    async with asyncio.timeout(10):
        while True:
            if await redis.zcard(keys.queue(MODEL)):
                return
            await asyncio.sleep(0.01)


async def reading_clients(redis: Redis) -> list[str]:
    """The names of the clients whose last command was a stream read (XREAD)."""
    return [client.get("name", "") for client in await redis.client_list() if client.get("cmd") == "xread"]


async def test_aborts_of_ended_jobs_leave_the_abort_set_empty_and_old_entries_go(
    redis: Redis, redis_url: str
) -> None:
    async with stack(redis_url) as (client, _):
        answers = [await client.post("/v1/chat/completions", json=chat_body()) for _ in range(20)]
        pool = await jobqueue.open_pool(redis_url)
        await redis.zadd(keys.ARQ_ABORTS, {"long-gone": int(time.time() * 1000) - 61_000})
        for answer in answers:
            for _ in range(10):  # a client cancelling again and again
                await jobqueue.abort(pool, answer.headers["x-request-id"])
        await pool.aclose()

    assert [answer.status_code for answer in answers] == [200] * 20
    assert await redis.zcard(keys.ARQ_ABORTS) == 0


async def test_requests_refused_with_429_leave_no_abort_entry(redis: Redis, redis_url: str) -> None:
    await announce(redis)  # "live", but nobody consumes the queue: the first request waits
    async with gateway(redis_url, max_queued_requests=1, request_timeout_s=30) as (_app, client):
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=chat_body()))
        await until_queued(redis)
        refused = [await client.post("/v1/chat/completions", json=chat_body()) for _ in range(20)]
        in_set = await redis.zcard(keys.ARQ_ABORTS)
        queued = await redis.zcard(keys.queue(MODEL))
        waiting.cancel()

    assert [answer.status_code for answer in refused] == [429] * 20
    assert (in_set, queued) == (0, 1)


async def test_open_streams_share_a_few_reading_connections_and_all_finish(
    redis: Redis, redis_url: str
) -> None:
    stand_in = HeldStreams()
    async with held_worker(redis_url, stand_in), gateway(redis_url, stream_readers=READERS) as (_app, client):
        body = chat_body(stream=True)
        streams = [
            asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(STREAMS)
        ]
        async with asyncio.timeout(30):
            await stand_in.all_started.wait()
        readers = await reading_clients(redis)
        stand_in.release.set()
        async with asyncio.timeout(30):
            answers = await asyncio.gather(*streams)

    assert 1 <= len(readers) <= READERS
    assert set(readers) == {READER_CLIENT_NAME}
    texts = [
        "".join(chunk["choices"][0]["delta"].get("content", "") for _, chunk in parse_sse(answer.text)[:-1])
        for answer in answers
    ]
    assert texts == ["".join(WORDS)] * STREAMS


async def test_an_exhausted_redis_pool_answers_503_not_a_hang(redis: Redis, redis_url: str) -> None:
    stand_in = StandInWorker(replies("Hello"))
    settings = {"redis_max_connections": 1, "redis_timeout_s": 0.2}
    async with running_worker(redis_url, stand_in), gateway(redis_url, **settings) as (app, client):
        connections = app.state.gateway.pool.connection_pool
        held = await connections.get_connection()  # the pool's only connection, busy elsewhere
        try:
            refused = await client.post("/v1/chat/completions", json=chat_body())
        finally:
            await connections.release(held)
        served = await client.post("/v1/chat/completions", json=chat_body())

    assert refused.status_code == 503
    assert refused.json()["error"] | {"message": None} == {
        "message": None,
        "type": "service_unavailable_error",
        "param": None,
        "code": "service_unavailable",
    }
    assert served.status_code == 200
