"""Agent requests through the whole stack (real Redis, fake-engine worker, the openai SDK): accepted and
answered, or refused with a 400 naming the parameter before any job is queued or any SSE byte sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from redis.asyncio import Redis

from shared import keys
from tests.helpers import FAKE_MODEL, running_stack

HI: list[Any] = [{"role": "user", "content": "Hi"}]
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
HISTORY: list[Any] = [
    *HI,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "3 C"},
]

Stack = tuple[httpx.AsyncClient, openai.AsyncOpenAI]


@pytest.fixture
async def stack(redis_url: str) -> AsyncIterator[Stack]:
    async with running_stack(redis_url) as client:
        yield (
            client,
            openai.AsyncOpenAI(
                base_url="http://testserver/v1", api_key="x", http_client=client, max_retries=0
            ),
        )


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [WEATHER]},
        {"tools": [WEATHER], "tool_choice": "none", "messages": HISTORY},
        {"functions": [WEATHER["function"]], "function_call": "auto"},
        {
            "response_format": {"type": "text"},
            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
        },
        {"reasoning_effort": "low", "parallel_tool_calls": False, "tools": []},
    ],
)
async def test_agent_requests_are_accepted_and_answered(stack: Stack, fields: dict[str, Any]) -> None:
    _, sdk = stack
    body: dict[str, Any] = {"messages": HI, **fields}

    completion = await sdk.chat.completions.create(model=FAKE_MODEL, max_tokens=3, **body)

    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/chat/completions", {"guided_regex": "([a-z]"}, "guided_regex"),
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "no"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ("/v1/chat/completions", {"tools": [WEATHER, WEATHER]}, "tools"),
        (
            "/v1/chat/completions",
            {"tools": [WEATHER], "tool_choice": "required", "guided_json": {"type": "object"}},
            "guided_json",
        ),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"regex": "a", "backend": "xgrammar"}},
            "structured_outputs.backend",
        ),
        ("/v1/chat/completions", {"chat_template": "{{ x }}"}, "chat_template"),
        ("/v1/chat/completions", {"documents": []}, "documents"),
        ("/v1/completions", {"structured_outputs": {"grammar": "start: ("}}, "structured_outputs.grammar"),
        (
            "/v1/completions",
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
            "guided_regex",
        ),
        ("/v1/completions", {"tools": [WEATHER]}, "tools"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_what_cannot_be_honoured_is_a_400_before_queueing(
    stack: Stack, redis: Redis, path: str, fields: dict[str, Any], param: str, stream: bool
) -> None:
    client, _ = stack
    prompt: dict[str, Any] = {"messages": HI} if path.endswith("chat/completions") else {"prompt": "x"}

    response = await client.post(path, json={"model": FAKE_MODEL, "stream": stream, **prompt, **fields})

    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["param"] == param
    assert response.json()["error"]["type"] == "invalid_request_error"
    # No job ran: a worker would have opened the request's event stream.
    assert not await redis.exists(keys.events(response.headers["x-request-id"]))


async def test_langchains_agent_history_is_accepted_as_it_sends_it(stack: Stack) -> None:
    client, _ = stack
    llm = ChatOpenAI(
        base_url="http://testserver/v1", api_key="x", model=FAKE_MODEL, max_tokens=3, http_async_client=client
    )
    call = AIMessage(
        content="", tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_1"}]
    )
    history = [HumanMessage("Weather in Oslo?"), call, ToolMessage("3 C", tool_call_id="call_1")]

    answer = await llm.bind_tools([WEATHER], tool_choice="none").ainvoke(history)

    assert isinstance(answer.content, str) and answer.content
