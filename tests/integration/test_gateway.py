"""The real gateway app against a real Redis and a real arq worker whose job replays scripted events.

The stand-in worker speaks exactly the shared contract (GenerationJob in, Accepted /
Delta / Finished / Failed out on the request's stream), so these tests pin the
gateway's side of it without a model or an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
from arq.connections import ArqRedis
from arq.constants import abort_jobs_ss
from dirty_equals import IsInt, IsStr
from fastapi import FastAPI
from redis.asyncio import Redis
from starlette.types import Message

from gateway.http.app import create_app
from shared import keys, registry
from shared.codec import decode_job
from shared.errors import ContextLengthExceeded, WorkerFailed
from shared.jobs import jobqueue
from shared.jobs.streams import EventWriter
from shared.protocol import Accepted, Delta, Failed, Finished, FinishReason, GenerationJob, TokenEvent, Usage
from shared.redis_server import EmbeddedRedis
from shared.registry import WorkerInfo
from shared.settings import GatewaySettings
from tests.helpers import arq_stand_in

MODEL = "scripted-model"
BASE_URL = "http://gateway"
Script = Callable[[GenerationJob], list[TokenEvent]]


def replies(*texts: str, prompt_tokens: int = 5) -> Script:
    """A script answering every job with ``texts`` then a stop."""

    def script(job: GenerationJob) -> list[TokenEvent]:
        prompt_text = job.prompt.text if job.echo and job.prompt.kind == "text" else None
        deltas: list[TokenEvent] = [Delta(text=text, token_ids=[index]) for index, text in enumerate(texts)]
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=len(texts))
        accepted = Accepted(prompt_tokens=prompt_tokens, worker_id="w-1", prompt_text=prompt_text)
        return [accepted, *deltas, Finished(finish_reason=FinishReason.STOP, usage=usage)]

    return script


def never_finishes(job: GenerationJob) -> list[TokenEvent]:
    return [Accepted(prompt_tokens=3, worker_id="w-1"), Delta(text="Hel", token_ids=[1])]


def refuses_long_prompts(job: GenerationJob) -> list[TokenEvent]:
    error = ContextLengthExceeded("This model's maximum context length is 64 tokens.", param="messages")
    return [Failed(error=error.to_info())]


def fails_midway(job: GenerationJob) -> list[TokenEvent]:
    error = WorkerFailed("the engine crashed")
    return [
        Accepted(prompt_tokens=3, worker_id="w-1"),
        Delta(text="Hel", token_ids=[1]),
        Failed(error=error.to_info()),
    ]


@dataclass
class StandInWorker:
    """Records the jobs it ran and whether they were cancelled (aborted)."""

    script: Script
    hold: bool = False  # after the script, wait until cancelled instead of returning
    jobs: list[GenerationJob] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def generate(self, ctx: dict[str, Any], payload: dict[str, Any]) -> None:
        job = decode_job(payload)
        self.jobs.append(job)
        writer = EventWriter(ctx["redis"])
        for event in self.script(job):
            await writer.publish_step([(job.request_id, event)])
        self.started.set()
        if not self.hold:
            return
        try:
            await asyncio.Event().wait()  # until arq cancels the job
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def announce(
    redis: Redis, model: str = MODEL, worker_id: str = "w-1", max_model_len: int = 2048
) -> None:
    info = WorkerInfo(worker_id=worker_id, model=model, max_model_len=max_model_len, started_at=time.time())
    await registry.heartbeat(redis, info)


@contextlib.asynccontextmanager
async def running_worker(redis_url: str, stand_in: StandInWorker, model: str = MODEL) -> AsyncIterator[None]:
    pool: ArqRedis = await jobqueue.open_pool(redis_url)
    await announce(pool, model)
    async with arq_stand_in(pool, stand_in.generate, model, allow_abort_jobs=True):
        yield


@contextlib.asynccontextmanager
async def gateway(redis_url: str, **settings: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The real app with its real lifespan, reached in-process."""
    app = create_app(GatewaySettings(redis_url=redis_url, **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=10) as client:
            yield app, client


@contextlib.asynccontextmanager
async def stack(
    redis_url: str, script: Script | None = None, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, StandInWorker]]:
    stand_in = StandInWorker(script or replies("Hello", ", world"))
    async with running_worker(redis_url, stand_in), gateway(redis_url, **settings) as (_app, client):
        yield client, stand_in


def openai_sdk(client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """The official SDK, reaching the in-process app through the test client's transport."""
    http_client = httpx.AsyncClient(transport=client._transport, base_url=BASE_URL)
    return openai.AsyncOpenAI(
        base_url=f"{BASE_URL}/v1",
        api_key="unused",
        # The SDK is typed for httpx2 but accepts a classic httpx client, which ASGITransport needs.
        http_client=http_client,  # type: ignore[arg-type]
        max_retries=0,
    )


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **extra}


def parse_sse(body: str) -> list[tuple[str | None, Any]]:
    """(id, payload) per SSE event; payloads JSON-decoded except "[DONE]"; comment lines skipped."""
    parsed: list[tuple[str | None, Any]] = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "data" in fields:
            data = fields["data"]
            parsed.append((fields.get("id"), data if data == "[DONE]" else json.loads(data)))
    return parsed


async def test_chat_completion_is_one_openai_object_with_the_request_id(redis: Redis, redis_url: str) -> None:
    async with stack(redis_url) as (client, stand_in):
        response = await client.post("/v1/chat/completions", json=chat_body(max_completion_tokens=9, seed=1))

    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    assert response.json() == {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": IsInt(approx=int(time.time()), delta=5),
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello, world"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    (job,) = stand_in.jobs
    assert (job.request_id, job.sampling.max_tokens, job.sampling.seed) == (request_id, 9, 1)


async def test_completion_is_a_text_completion_with_the_prompt_echoed(redis: Redis, redis_url: str) -> None:
    async with stack(redis_url, replies(" upon", " a time")) as (client, _):
        response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "echo": True})

    assert response.status_code == 200
    assert response.json() == {
        "id": f"cmpl-{response.headers['x-request-id']}",
        "object": "text_completion",
        "created": IsInt(),
        "model": MODEL,
        "choices": [{"text": "Once upon a time", "index": 0, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


async def test_streamed_chat_sends_openai_chunks_usage_and_done(redis: Redis, redis_url: str) -> None:
    async with stack(redis_url) as (client, _):
        body = chat_body(stream=True, stream_options={"include_usage": True})
        response = await client.post("/v1/chat/completions", json=body)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunk_id = f"chatcmpl-{response.headers['x-request-id']}"

    def chunk(choices: list[Any], usage: Any = None) -> dict[str, Any]:
        return {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": IsInt(),
            "model": MODEL,
            "choices": choices,
            "usage": usage,
        }

    def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    events = parse_sse(response.text)
    assert [payload for _id, payload in events] == [
        chunk([choice({"role": "assistant", "content": ""})]),
        chunk([choice({"content": "Hello"})]),
        chunk([choice({"content": ", world"})]),
        chunk([choice({}, "stop")]),
        chunk([], {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
        "[DONE]",
    ]
    stream_ids = [event_id for event_id, _payload in events]
    assert stream_ids[:3] == [IsStr(regex=r"\d+-\d+")] * 3
    # One id per Redis entry, on the last frame made from it; [DONE] has none.
    assert stream_ids[3:] == [None, IsStr(regex=r"\d+-\d+"), None]


async def test_streamed_completion_sends_text_chunks(redis: Redis, redis_url: str) -> None:
    async with stack(redis_url, replies("A", "B")) as (client, _):
        response = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": [1, 2], "stream": True}
        )

    payloads = [payload for _id, payload in parse_sse(response.text)]
    assert [(p["choices"][0]["text"], p["choices"][0]["finish_reason"]) for p in payloads[:-1]] == [
        ("A", None),
        ("B", None),
        ("", "stop"),
    ]
    assert payloads[-1] == "[DONE]"
    assert all(p["object"] == "text_completion" and "usage" not in p for p in payloads[:-1])


async def test_context_length_exceeded_is_a_plain_400_before_any_sse_byte(
    redis: Redis, redis_url: str
) -> None:
    async with stack(redis_url, refuses_long_prompts) as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))

    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": {
            "message": "This model's maximum context length is 64 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


async def test_failure_after_streaming_began_is_an_error_event_without_done(
    redis: Redis, redis_url: str
) -> None:
    async with stack(redis_url, fails_midway) as (client, _):
        response = await client.post("/v1/chat/completions", json=chat_body(stream=True))

    payloads = [payload for _id, payload in parse_sse(response.text)]
    assert response.status_code == 200
    assert payloads[-1] == {
        "error": {
            "message": "the engine crashed",
            "type": "server_error",
            "param": None,
            "code": "worker_failed",
        }
    }
    assert "[DONE]" not in payloads


async def test_unknown_model_is_404_model_not_found(redis: Redis, redis_url: str) -> None:
    async with gateway(redis_url) as (_app, client):
        response = await client.post("/v1/chat/completions", json=chat_body(model="nobody/serves-this"))

    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": (
                "The model `nobody/serves-this` does not exist or is not served here. "
                "No model is served here right now."
            ),
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert await redis.zcard(keys.queue("nobody/serves-this")) == 0


async def test_known_model_without_a_live_worker_is_503(redis: Redis, redis_url: str) -> None:
    await announce(redis, worker_id="gone")
    await registry.deregister(redis, "gone")

    async with gateway(redis_url) as (_app, client):
        response = await client.post("/v1/chat/completions", json=chat_body())

    assert response.status_code == 503
    assert response.json()["error"] == {
        "message": IsStr(regex=r"No worker is serving the model `scripted-model`.*"),
        "type": "service_unavailable_error",
        "param": "model",
        "code": "no_live_worker",
    }


async def test_models_lists_live_models_once_each(redis: Redis, redis_url: str) -> None:
    await announce(redis, worker_id="a")
    await announce(redis, worker_id="b", max_model_len=1024)
    await announce(redis, model="org/other", worker_id="c")

    async with gateway(redis_url) as (_app, client):
        listing = await client.get("/v1/models")
        one = await client.get("/v1/models/org/other")
        missing = await client.get("/v1/models/absent")

    card = {"object": "model", "created": IsInt(), "owned_by": "tokenferry"}
    assert listing.json() == {
        "object": "list",
        "data": [
            {"id": "org/other", **card, "max_model_len": 2048},
            {"id": MODEL, **card, "max_model_len": 1024},
        ],
    }
    assert one.json() == {"id": "org/other", **card, "max_model_len": 2048}
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_found")


async def test_api_key_is_required_when_configured(redis: Redis, redis_url: str) -> None:
    async with stack(redis_url, api_keys=["secret"]) as (client, _):
        refused = await client.post("/v1/chat/completions", json=chat_body())
        allowed = await client.post(
            "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer secret"}
        )
        health = await client.get("/health")

    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "invalid_api_key")
    assert allowed.status_code == 200
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert all("x-request-id" in r.headers for r in (refused, allowed, health))


async def test_deadline_passing_is_504_and_aborts_the_job(redis: Redis, redis_url: str) -> None:
    await announce(redis)  # "live", but nobody consumes the queue

    async with gateway(redis_url, request_timeout_s=0.3) as (_app, client):
        response = await client.post("/v1/chat/completions", json=chat_body())

    assert (response.status_code, response.json()["error"]["code"]) == (504, "timeout")
    assert await redis.zscore(abort_jobs_ss, response.headers["x-request-id"]) is not None


async def test_redis_going_away_is_503_not_a_hang(redis: Redis) -> None:
    with EmbeddedRedis() as private:
        async with gateway(private.url) as (_app, client):
            private.stop()
            response = await client.post("/v1/chat/completions", json=chat_body())

    assert (response.status_code, response.json()["error"]["code"]) == (503, "service_unavailable")


async def call_directly(app: FastAPI, body: dict[str, Any], disconnect: asyncio.Event) -> list[Message]:
    """Call the ASGI app as a server would, sending http.disconnect once ``disconnect`` is set."""
    sent: list[Message] = []
    request_sent = False

    async def receive() -> Message:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"host", b"gateway")],
        "client": ("127.0.0.1", 1),
        "server": ("gateway", 80),
    }
    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("stream", [False, True])
async def test_client_disconnect_aborts_the_running_job(redis: Redis, redis_url: str, stream: bool) -> None:
    stand_in = StandInWorker(never_finishes, hold=True)
    disconnect = asyncio.Event()

    async def disconnect_once_generating() -> None:
        await stand_in.started.wait()
        disconnect.set()

    async with running_worker(redis_url, stand_in), gateway(redis_url) as (app, _client):
        async with asyncio.timeout(20):  # generous: CI shares two cores
            trigger = asyncio.create_task(disconnect_once_generating())
            await call_directly(app, chat_body(stream=stream), disconnect)
            await trigger
            await stand_in.cancelled.wait()

    assert stand_in.cancelled.is_set()


async def test_official_openai_sdk_reads_both_answer_kinds(redis: Redis, redis_url: str) -> None:
    async with stack(redis_url) as (client, _):
        sdk = openai_sdk(client)
        messages: Any = [{"role": "user", "content": "Hi"}]
        completion = await sdk.chat.completions.create(model=MODEL, messages=messages)
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        await sdk.close()

    assert completion.choices[0].message.content == "Hello, world"
    assert completion.usage is not None and completion.usage.total_tokens == 7
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello, world"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


async def test_official_openai_sdk_raises_on_an_in_stream_error(redis: Redis, redis_url: str) -> None:
    async with stack(redis_url, fails_midway) as (client, _):
        sdk = openai_sdk(client)
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        with pytest.raises(openai.APIError, match="the engine crashed"):
            _ = [chunk async for chunk in stream]
        await sdk.close()
