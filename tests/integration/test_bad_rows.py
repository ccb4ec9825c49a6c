"""One request's bad input costs nobody else anything: refused alone before the engine, or failed alone in it.

Both against a real Redis and the fake engine: the gateway and worker stack for the
refusals (two tenants' keys), and the worker's driver with a preparation that misses
the vocabulary check for a row the engine itself cannot run.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from redis.asyncio import Redis

from shared.access import apikeys
from shared.jobs import jobqueue
from shared.jobs.streams import EventWriter
from shared.protocol import (
    Accepted,
    ChatMessage,
    ChatPrompt,
    Delta,
    Failed,
    Finished,
    GenerationJob,
    Prompt,
    SamplingSpec,
    TextPrompt,
    TokenEvent,
    TokenPrompt,
)
from tests.helpers import FAKE_MODEL, all_events, chat_body, parse_sse, running_stack, until_running
from worker.driver.engine_driver import EngineDriver
from worker.driver.lifecycle import JobLifecycle
from worker.engine.fake import ByteTokenizer, FakeEngine
from worker.requests.limits import ModelLimits
from worker.requests.params import DefaultLayers
from worker.requests.preparation import prepare

SCRIPT = "Every good stream ends with all of its text."
ADMIN = "admin-secret"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


async def _streamed_text(client: httpx.AsyncClient, secret: str) -> str:
    response = await client.post(CHAT, json=chat_body(stream=True), headers=bearer(secret))
    assert response.status_code == 200
    chunks = [chunk for chunk in parse_sse(response.text) if chunk != "[DONE]"]
    return "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])


async def test_bad_requests_get_a_400_naming_the_field_while_another_tenants_streams_finish(
    redis: Redis, redis_url: str
) -> None:
    alice = await apikeys.create_key(redis, "alice")
    bob = await apikeys.create_key(redis, "bob")
    gateway = {"admin_api_keys": [ADMIN], "auth_cache_s": 0}
    async with running_stack(
        redis_url, gateway=gateway, fake_script=SCRIPT, fake_step_delay_s=0.02
    ) as client:
        streams = [asyncio.create_task(_streamed_text(client, bob.secret)) for _ in range(3)]
        await until_running(redis, 3)
        past_vocabulary = await client.post(
            COMPLETIONS,
            json={"model": FAKE_MODEL, "prompt": [72, 105, 300], "stream": True},
            headers=bearer(alice.secret),
        )
        huge_beams = await client.post(
            CHAT, json=chat_body(num_beams=1_000_000, stream=True), headers=bearer(alice.secret)
        )
        texts = await asyncio.gather(*streams)

    for refused, param in ((past_vocabulary, "prompt"), (huge_beams, "num_beams")):
        assert refused.status_code == 400
        assert refused.headers["content-type"].startswith("application/json")  # not one SSE byte
        assert (refused.json()["error"]["type"], refused.json()["error"]["param"]) == (
            "invalid_request_error",
            param,
        )
    assert "Token id 300 is outside the model's vocabulary" in past_vocabulary.json()["error"]["message"]
    assert texts == [SCRIPT] * 3


@pytest.fixture
async def driver(redis_url: str) -> AsyncIterator[EngineDriver]:
    """A worker's driver whose preparation lets every token id through, as one without the check did."""
    pool = await jobqueue.open_pool(redis_url)
    writer = EventWriter(pool)
    tokenizer = ByteTokenizer()
    lax = ModelLimits(4096, tokenizer.eos_token_ids, vocab_size=10**9, max_num_beams=4)
    preparer = functools.partial(
        prepare, tokenizer=tokenizer, defaults=DefaultLayers(SamplingSpec(), SamplingSpec()), limits=lax
    )
    engine = FakeEngine(SCRIPT, step_delay_s=0.01)
    driver = EngineDriver(
        engine, JobLifecycle(pool, writer, tokenizer, preparer, "w1"), writer, FAKE_MODEL, batch_hold_s=0.05
    )
    serving = asyncio.create_task(driver.serve())
    try:
        yield driver
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        driver.close()
        await pool.aclose()


def _job(request_id: str, prompt: Prompt, **fields: object) -> GenerationJob:
    return GenerationJob(
        request_id=request_id, model=FAKE_MODEL, prompt=prompt, created_at=time.time(), **fields
    )


def _texts(events: list[TokenEvent]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for event in events:
        if isinstance(event, Delta):
            texts[event.index] = texts.get(event.index, "") + event.text
    return texts


async def test_a_row_the_engine_cannot_run_fails_alone_and_every_other_stream_finishes(
    driver: EngineDriver, redis: Redis
) -> None:
    chat = ChatPrompt(messages=[ChatMessage(role="user", content="Hi")])
    jobs = [
        _job("good-chat", chat),
        _job("bad", TokenPrompt(token_ids=[72, 300, 105])),  # past the fake's 257 ids
        _job("good-line", TextPrompt(text="a batch line"), lane="batch"),
        _job("good-two", TextPrompt(text="two choices"), n=2),
    ]
    runs = asyncio.gather(*(driver.run(job) for job in jobs))
    events = {job.request_id: await all_events(redis, job.request_id, timeout_s=30) for job in jobs}
    await asyncio.wait_for(runs, timeout=10)

    accepted, failed = events.pop("bad")
    assert isinstance(accepted, Accepted) and isinstance(failed, Failed)
    assert (failed.error.code, failed.error.message) == (
        "worker_failed",
        "the model failed while generating this request",  # no exception text, no address
    )
    for request_id, stream in events.items():
        assert isinstance(stream[-1], Finished), request_id
        assert stream[-1].finish_reason == "stop"
    assert _texts(events["good-chat"]) == _texts(events["good-line"]) == {0: SCRIPT}
    assert _texts(events["good-two"]) == {0: SCRIPT, 1: SCRIPT}
