"""Agents against the real model: structured outputs and tool calls through the openai SDK and LangChain.

What a user of an agent framework checks: the SDK's ``parse`` hands back the
object, every JSON-schema answer validates, a forced tool call is always that
function with valid arguments, a streamed call reassembles to the unstreamed one,
LangChain's tool loop and structured output work, and a bad schema is a 400
naming its parameter. The model is the bundled 135M one: outputs are right
because decoding is constrained, not because the model is good, so these tests
use modest ``max_tokens`` and bounded strings and lists.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from pydantic import BaseModel, Field

pytestmark = pytest.mark.timeout(900)

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 20}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a timezone.",
            "parameters": TIME_PARAMETERS,
        },
    },
]
SCHEMAS_BY_TOOL = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
ASK_WEATHER: list[Any] = [{"role": "user", "content": "What is the weather like in Paris today?"}]


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
    population_millions: int = Field(ge=0, le=50)
    is_capital: bool


def function_calls(message: ChatCompletionMessage) -> list[tuple[str, dict[str, Any]]]:
    return [
        (call.function.name, json.loads(call.function.arguments))
        for call in message.tool_calls or []
        if isinstance(call, ChatCompletionMessageFunctionToolCall)
    ]


# Structured outputs through the SDK


def test_sdk_parse_returns_the_pydantic_object(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Describe Paris as a city record."}],
        response_format=City,
        max_tokens=80,
        temperature=0,
    )

    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City)
    assert completion.choices[0].finish_reason == "stop"


_LEAVES: list[dict[str, Any]] = [
    {"type": "string", "maxLength": 12},
    {"type": "integer", "minimum": 0, "maximum": 100},
    {"type": "number", "minimum": -5, "maximum": 5},
    {"type": "boolean"},
    {"enum": ["red", "green", "blue"]},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 8}]},
    {
        "type": "object",
        "properties": {
            "x": {"type": "integer", "minimum": 0, "maximum": 9},
            "label": {"type": "string", "maxLength": 8},
        },
        "required": ["x", "label"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}},
            "required": ["id"],
            "additionalProperties": False,
        },
        "maxItems": 2,
    },
    {"type": ["string", "null"], "maxLength": 10},
]
_NAMES = ["name", "size", "score", "active", "color", "digits", "code", "point", "items", "note", "title"]
_TOPICS = [
    "a cat",
    "a city",
    "a car",
    "a song",
    "a book",
    "a tree",
    "a planet",
    "a chair",
    "a river",
    "a game",
]


def varied_schemas(count: int = 50) -> list[dict[str, Any]]:
    """``count`` object schemas: nested objects, arrays, enums, bounded numbers, optional fields, anyOf."""
    schemas = []
    for index in range(count):
        picks = [index % 10, (index * 3 + 1) % 10, (index * 7 + 2) % 10][: 2 + index % 2]
        properties = {
            f"{_NAMES[(index + slot) % len(_NAMES)]}_{slot}": _LEAVES[pick] for slot, pick in enumerate(picks)
        }
        names = list(properties)
        required = names[:-1] if index % 3 == 0 else names  # every third schema has an optional field
        schemas.append(
            {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
        )
    return schemas


async def test_json_schema_answers_validate_for_fifty_varied_schemas(gateway_url: str, model: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="unused", timeout=600, max_retries=0)
    schemas = varied_schemas()

    async def answer(index: int, schema: dict[str, Any]) -> tuple[str | None, str | None]:
        completion = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Describe {_TOPICS[index % len(_TOPICS)]} as JSON."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": f"s{index}", "schema": schema, "strict": True},
            },
            max_tokens=200,
            temperature=0,
        )
        return completion.choices[0].message.content, completion.choices[0].finish_reason

    answers = await asyncio.gather(*(answer(index, schema) for index, schema in enumerate(schemas)))

    for schema, (content, finish_reason) in zip(schemas, answers, strict=True):
        assert finish_reason == "stop", content
        jsonschema.validate(json.loads(content or ""), schema)


def test_guided_choice_answers_one_of_the_choices(client: openai.OpenAI, model: str) -> None:
    choices = ["positive", "negative", "neutral"]
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Classify the sentiment: I love this library!"}],
        max_tokens=10,
        extra_body={"guided_choice": choices},
    )

    assert completion.choices[0].message.content in choices


def test_guided_regex_output_matches_the_regex(client: openai.OpenAI, model: str) -> None:
    pattern = r"[A-Z][a-z]{2,8} [0-9]{1,3}"
    completion = client.completions.create(
        model=model,
        prompt="A name and an age:",
        max_tokens=20,
        extra_body={"structured_outputs": {"regex": pattern}},
    )

    assert re.fullmatch(pattern, completion.choices[0].text)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"guided_regex": "([a-z]"}, "guided_regex"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}},
            "tool_choice",
        ),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_bad_schema_regex_or_tool_choice_is_a_400_naming_the_param(
    client: openai.OpenAI, model: str, fields: dict[str, Any], param: str, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=ASK_WEATHER, stream=stream, extra_body=fields)

    assert caught.value.status_code == 400
    assert caught.value.param == param


# Tool calls through the SDK


@pytest.mark.parametrize("question", ["Weather in Paris?", "Is it cold in Oslo?", "Tell me a joke.", "Hi!"])
def test_a_named_tool_choice_always_calls_that_function_with_valid_arguments(
    client: openai.OpenAI, model: str, question: str
) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        temperature=0,
    )

    [(name, arguments)] = function_calls(completion.choices[0].message)
    assert name == "get_weather"
    jsonschema.validate(arguments, WEATHER_PARAMETERS)


def test_required_with_two_tools_calls_one_of_them_validly(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )

    choice = completion.choices[0]
    [(name, arguments)] = function_calls(choice.message)
    assert name in SCHEMAS_BY_TOOL
    jsonschema.validate(arguments, SCHEMAS_BY_TOOL[name])
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None


def test_a_streamed_tool_call_reassembles_to_the_unstreamed_one(client: openai.OpenAI, model: str) -> None:
    asked: dict[str, Any] = {
        "model": model,
        "messages": ASK_WEATHER,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 80,
        "temperature": 0,
        "seed": 7,
    }
    whole = client.chat.completions.create(**asked)
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(**asked, stream=True):
        state.handle_chunk(chunk)
    streamed = state.get_final_completion()

    assert function_calls(streamed.choices[0].message) == function_calls(whole.choices[0].message)
    assert function_calls(whole.choices[0].message)
    assert streamed.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"


def test_legacy_functions_get_a_function_call(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=ASK_WEATHER,
        functions=[TOOLS[0]["function"]],
        function_call={"name": "get_weather"},
        max_tokens=60,
        temperature=0,
    )

    call = completion.choices[0].message.function_call
    assert call is not None and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)


# LangChain


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is 21 degrees and sunny in {city}."


def langchain_model(gateway_url: str, model: str) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{gateway_url}/v1",
        api_key="unused",
        model=model,
        temperature=0,
        max_tokens=80,
        max_retries=0,
    )


def test_langchain_tool_loop_calls_then_answers(gateway_url: str, model: str) -> None:
    llm = langchain_model(gateway_url, model)
    messages: list[BaseMessage] = [HumanMessage("What is the weather in Paris?")]

    call = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    [tool_call] = call.tool_calls
    assert tool_call["name"] == "get_weather" and isinstance(tool_call["args"]["city"], str)
    messages += [call, ToolMessage(get_weather.invoke(tool_call["args"]), tool_call_id=tool_call["id"])]
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(messages)

    assert not answer.tool_calls
    assert isinstance(answer.content, str) and answer.content.strip()


def test_langchain_reassembles_a_streamed_call_into_the_unstreamed_one(gateway_url: str, model: str) -> None:
    llm = langchain_model(gateway_url, model).bind_tools([get_weather], tool_choice="get_weather")
    messages = [HumanMessage("What is the weather in Oslo?")]

    whole = llm.invoke(messages)
    chunks = list(llm.stream(messages))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk

    assert len(chunks) > 1  # it did stream
    assert [(call["name"], call["args"]) for call in streamed.tool_calls] == [
        (call["name"], call["args"]) for call in whole.tool_calls
    ]
    assert [call["name"] for call in whole.tool_calls] == ["get_weather"]


class Verdict(BaseModel):
    sentiment: Literal["positive", "negative"]
    confidence: int = Field(ge=0, le=10)


def test_langchain_structured_output_returns_the_pydantic_object(gateway_url: str, model: str) -> None:
    llm = langchain_model(gateway_url, model).with_structured_output(Verdict, method="json_schema")

    verdict = llm.invoke("Classify the sentiment of: 'This is the best day ever.'")

    assert isinstance(verdict, Verdict)


def test_tool_messages_reach_the_model_and_it_answers(gateway_url: str, model: str) -> None:
    body = {
        "model": model,
        "messages": [
            *ASK_WEATHER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Paris", "unit": "celsius"}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"},
        ],
        "tools": TOOLS,
        "tool_choice": "none",
        "max_tokens": 40,
        "temperature": 0,
    }

    response = httpx.post(f"{gateway_url}/v1/chat/completions", json=body, timeout=300)

    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"].strip()
