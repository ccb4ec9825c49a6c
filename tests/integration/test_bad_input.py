"""Every kind of bad input gets a 4xx in OpenAI's error shape naming the problem and the param, never a 5xx.

One table, driven through the real gateway app, a real Redis and a fake-engine
worker with a 64-token context and a 2 KiB body limit, so the limits are cheap to hit.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.helpers import FAKE_MODEL, chat_body, running_stack

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
JSON = {"content-type": "application/json"}
CONTEXT = 64
BODY_LIMIT = 2048


def completion_body(**extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "prompt": "Once", **extra}


@dataclass(frozen=True)
class Case:
    path: str
    body: Any  # a JSON document, or raw bytes sent as they are
    status: int
    param: str | None
    code: str | None
    message: str  # a regex the error message must match
    headers: dict[str, str] = field(default_factory=dict)


LONE_SURROGATE = b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud800"}]}'
CASES = {
    "invalid JSON": Case(CHAT, b'{"model": ', 400, None, None, r"not valid JSON", JSON),
    "body not an object": Case(CHAT, b"[1, 2]", 400, None, None, r"must be a JSON object", JSON),
    "wrong type": Case(CHAT, chat_body(temperature="hot"), 400, "temperature", None, r"valid number"),
    "missing model": Case(CHAT, {"messages": []}, 400, "model", None, r"Missing required parameter: 'model'"),
    "missing messages": Case(CHAT, {"model": FAKE_MODEL}, 400, "messages", None, r"Missing .*'messages'"),
    "missing prompt": Case(COMPLETIONS, {"model": FAKE_MODEL}, 400, "prompt", None, r"Missing .*'prompt'"),
    "empty messages": Case(CHAT, chat_body() | {"messages": []}, 400, "messages", None, r"at least 1 item"),
    "unknown role": Case(
        CHAT, chat_body() | {"messages": [{"role": "robot", "content": "Hi"}]}, 400, "messages.0.role", None,
        r"Invalid role 'robot'",
    ),
    "zero max_tokens": Case(CHAT, chat_body(max_tokens=0), 400, "max_tokens", None, r">= 1|equal to 1"),
    "negative max_tokens": Case(
        COMPLETIONS, completion_body(max_tokens=-5), 400, "max_tokens", None, r"greater than or equal to 1"
    ),
    "max_tokens beyond the context": Case(
        CHAT, chat_body(max_tokens=CONTEXT), 400, "messages", "context_length_exceeded",
        r"maximum context length is 64 tokens",
    ),
    "temperature too high": Case(CHAT, chat_body(temperature=2.5), 400, "temperature", None, r"equal to 2"),
    "temperature negative": Case(
        COMPLETIONS, completion_body(temperature=-1), 400, "temperature", None, r"greater than or equal to 0"
    ),
    "top_p zero": Case(CHAT, chat_body(top_p=0), 400, "top_p", None, r"greater than 0"),
    "top_p above one": Case(COMPLETIONS, completion_body(top_p=1.5), 400, "top_p", None, r"equal to 1"),
    "n too large": Case(CHAT, chat_body(n=1000), 400, "n", None, r"\bn\b|choice"),
    "seed beyond int64": Case(CHAT, chat_body(seed=2**64), 400, "seed", None, r"less than or equal to"),
    "too many stop sequences": Case(
        CHAT, chat_body(stop=["a", "b", "c", "d", "e"]), 400, "stop", None, r"At most 4 stop sequences"
    ),
    "body over the limit": Case(
        CHAT, chat_body("x" * BODY_LIMIT), 413, None, "payload_too_large", r"larger than the limit of 2048"
    ),
    "prompt too long": Case(
        COMPLETIONS, completion_body(prompt="x" * 100), 400, "messages", "context_length_exceeded",
        r"maximum context length is 64 tokens",
    ),
    "unknown model": Case(
        CHAT, chat_body(model="nobody/serves-this"), 404, "model", "model_not_found",
        r"`nobody/serves-this` does not exist",
    ),
    "invalid UTF-8": Case(CHAT, b'{"model": "fake-\xff\xfe"}', 400, None, None, r"not valid UTF-8", JSON),
    "lone surrogate escape": Case(
        CHAT, LONE_SURROGATE, 400, "messages.0.content", None, r"lone UTF-16 surrogate", JSON
    ),
    "wrong content type": Case(
        CHAT, b"{}", 415, "content-type", "unsupported_media_type", r"application/json, not text/plain",
        {"content-type": "text/plain"},
    ),
    "no content type": Case(
        COMPLETIONS, b"{}", 415, "content-type", "unsupported_media_type", r"not missing"
    ),
}  # fmt: skip


@pytest.fixture
async def client(redis: Redis, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with running_stack(
        redis_url, max_model_len=CONTEXT, gateway={"max_body_bytes": BODY_LIMIT}
    ) as client:
        yield client


async def test_every_bad_input_is_a_4xx_naming_the_problem(client: httpx.AsyncClient) -> None:
    mismatches: dict[str, tuple[int, Any]] = {}
    for name, case in CASES.items():
        response = await _send(client, case)
        if not _matches(case, response):
            mismatches[name] = (response.status_code, response.json())

    assert mismatches == {}


async def _send(client: httpx.AsyncClient, case: Case) -> httpx.Response:
    if isinstance(case.body, bytes):
        return await client.post(case.path, content=case.body, headers=case.headers)
    return await client.post(case.path, json=case.body, headers=case.headers)


def _matches(case: Case, response: httpx.Response) -> bool:
    error = response.json().get("error", {})
    return (
        response.status_code == case.status
        and set(error) == {"message", "type", "param", "code"}
        and (error["type"], error["param"], error["code"]) == ("invalid_request_error", case.param, case.code)
        and re.search(case.message, error["message"]) is not None
    )
