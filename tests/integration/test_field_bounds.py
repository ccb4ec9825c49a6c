"""Through the real gateway app: each field past its bound gets a 400 naming it, on every route.

OpenAI's routes (chat, completions, Responses) answer ``invalid_request_error``
with the field in ``param``; TGI's answer its own shape (422, ``error_type:
validation``) with the field named in the message, as TGI does. Bodies are sent
as raw JSON so that ``NaN``, ``Infinity`` and ``1e999`` reach the gateway as a
client would send them. A real Redis and a fake-engine worker stand behind.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.helpers import FAKE_MODEL, chat_body, running_stack

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
TGI = "/generate"
LONG_STOP = "x" * 513
HI = {"role": "user", "content": "Hi"}


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "prompt": "Once", **extra}


def response(**extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "input": "Once", **extra}


def tgi(**parameters: Any) -> dict[str, Any]:
    return {"inputs": "Once", "parameters": parameters}


def raw(body: dict[str, Any], **replace: str) -> bytes:
    """``body`` as JSON with each ``"@name"`` placeholder replaced by raw JSON text (``1e999``)."""
    text = json.dumps(body)
    for name, value in replace.items():
        text = text.replace(f'"@{name}"', value)
    return text.encode()


OPENAI_CASES = {
    "chat stop too long": (CHAT, chat_body(stop=LONG_STOP), "stop"),
    "chat num_beams": (CHAT, chat_body(num_beams=33), "num_beams"),
    "chat n": (CHAT, chat_body(n=129), "n"),
    "chat top_logprobs": (CHAT, chat_body(logprobs=True, top_logprobs=21), "top_logprobs"),
    "chat logit_bias superscript key": (CHAT, chat_body(logit_bias={"²": 1}), "logit_bias"),
    "chat logit_bias value": (CHAT, chat_body(logit_bias={"5": 101}), "logit_bias"),
    "chat logit_bias entries": (CHAT, chat_body(logit_bias={str(i): 1 for i in range(1025)}), "logit_bias"),
    "chat messages": (CHAT, chat_body() | {"messages": [HI] * 2049}, "messages"),
    "chat repetition_penalty NaN": (
        CHAT, raw(chat_body(repetition_penalty="@x"), x="NaN"), "repetition_penalty"
    ),
    "chat length_penalty 1e999": (CHAT, raw(chat_body(length_penalty="@x"), x="1e999"), "length_penalty"),
    "chat top_p Infinity": (CHAT, raw(chat_body(top_p="@x"), x="Infinity"), "top_p"),
    "completions stop list": (COMPLETIONS, completion(stop=["a", LONG_STOP]), "stop"),
    "completions best_of": (COMPLETIONS, completion(best_of=129), "best_of"),
    "completions logprobs": (COMPLETIONS, completion(logprobs=21), "logprobs"),
    "completions prompts": (COMPLETIONS, completion(prompt=["a"] * 65), "prompt"),
    "completions token id": (COMPLETIONS, completion(prompt=[1, 2**31]), "prompt"),
    "completions logit_bias NaN": (
        COMPLETIONS, raw(completion(logit_bias={"5": "@x"}), x="NaN"), "logit_bias"
    ),
    "completions presence_penalty -Infinity": (
        COMPLETIONS, raw(completion(presence_penalty="@x"), x="-Infinity"), "presence_penalty"
    ),
    "responses temperature NaN": (RESPONSES, raw(response(temperature="@x"), x="NaN"), "temperature"),
    "responses top_p 1e999": (RESPONSES, raw(response(top_p="@x"), x="1e999"), "top_p"),
    "responses messages": (RESPONSES, response(input=[HI] * 2049), "input"),
    "responses metadata": (RESPONSES, response(metadata={str(i): "v" for i in range(17)}), "metadata"),
}  # fmt: skip

TGI_CASES = {
    "tgi stop too long": (tgi(stop=[LONG_STOP]), "parameters.stop"),
    "tgi repetition_penalty NaN": (
        raw(tgi(repetition_penalty="@x"), x="NaN"), "parameters.repetition_penalty"
    ),
    "tgi temperature 1e999": (raw(tgi(temperature="@x"), x="1e999"), "parameters.temperature"),
    "tgi max_new_tokens": (tgi(max_new_tokens=2**31), "parameters.max_new_tokens"),
}  # fmt: skip


@pytest.fixture
async def client(redis: Redis, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with running_stack(redis_url) as client:
        yield client


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any] | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(path, content=content, headers={"content-type": "application/json"})


async def test_each_field_past_its_bound_is_a_400_naming_it(client: httpx.AsyncClient) -> None:
    answers = {name: await _post(client, path, body) for name, (path, body, _) in OPENAI_CASES.items()}

    wrong = {
        name: (answer.status_code, answer.json())
        for name, answer in answers.items()
        if (answer.status_code, answer.json()["error"]["type"], answer.json()["error"]["param"])
        != (400, "invalid_request_error", OPENAI_CASES[name][2])
    }
    assert wrong == {}


async def test_tgi_refuses_each_field_past_its_bound_naming_it(client: httpx.AsyncClient) -> None:
    answers = {name: await _post(client, TGI, body) for name, (body, _) in TGI_CASES.items()}

    wrong = {
        name: (answer.status_code, answer.json())
        for name, answer in answers.items()
        if answer.status_code != 422
        or answer.json()["error_type"] != "validation"
        or not re.match(rf"Invalid '{re.escape(TGI_CASES[name][1])}'", answer.json()["error"])
    }
    assert wrong == {}


async def test_requests_at_the_bounds_are_served(client: httpx.AsyncClient) -> None:
    # Four stops, one of 512 characters, and a logit_bias as large as the fake model's
    # vocabulary (257 tokens) are served, not refused.
    body = chat_body(
        max_tokens=3,
        stop=["x" * 512, "y", "z", "w"],
        logit_bias={str(token): 1 for token in range(257)},
    )

    answer = await _post(client, CHAT, body)

    assert answer.status_code == 200, answer.json()
    assert answer.json()["choices"][0]["finish_reason"] in {"stop", "length"}
