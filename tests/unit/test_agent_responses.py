"""Reasoning and tool calls render as OpenAI's objects: whole messages, and streamed deltas the openai SDK
puts back together into the same message."""

from __future__ import annotations

import json
from typing import Any

import openai.types.chat as sdk
from openai.lib.streaming.chat import ChatCompletionStreamState

from gateway.openai import render
from shared.protocol import (
    Accepted,
    ChoiceFinished,
    Delta,
    Finished,
    FinishReason,
    TokenEvent,
    ToolCallDelta,
    Usage,
)

META = render.ResponseMeta(id="chatcmpl-1", created=1_700_000_000, model="m")
LEGACY = render.ResponseMeta(id="chatcmpl-1", created=1_700_000_000, model="m", legacy_functions=True)


def delta(text: str = "", reasoning: str = "", calls: list[ToolCallDelta] | None = None) -> Delta:
    return Delta(text=text, token_ids=[1], reasoning=reasoning, tool_calls=calls)


def events(*deltas: Delta, reason: FinishReason = FinishReason.TOOL_CALLS) -> list[TokenEvent]:
    return [
        Accepted(prompt_tokens=5, worker_id="w1"),
        *deltas,
        ChoiceFinished(index=0, finish_reason=reason, completion_tokens=len(deltas)),
        Finished(finish_reason=reason, usage=Usage(prompt_tokens=5, completion_tokens=len(deltas))),
    ]


# Two calls, the second one's fragments interleaved with the first's, after some thinking.
CALLING = events(
    delta(reasoning="The user wants "),
    delta(reasoning="the weather."),
    delta(calls=[ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"city"')]),
    delta(
        calls=[
            ToolCallDelta(index=0, arguments=': "Paris"}'),
            ToolCallDelta(index=1, id="call_b", name="get_time"),
        ]
    ),
    delta(calls=[ToolCallDelta(index=1, arguments="{}")]),
)
WHOLE_MESSAGE = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "The user wants the weather.",
    "reasoning": "The user wants the weather.",
    "tool_calls": [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ],
}


def streamed(meta: render.ResponseMeta, stream_events: list[TokenEvent]) -> list[dict[str, Any]]:
    stream = render.ChatStream(meta)
    return [json.loads(chunk.model_dump_json()) for event in stream_events for chunk in stream.chunks(event)]


def sdk_accumulated(chunks: list[dict[str, Any]]) -> sdk.ChatCompletion:
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(sdk.ChatCompletionChunk.model_validate(chunk))
    return state.get_final_completion()


def function_calls(message: sdk.ChatCompletionMessage) -> list[tuple[str, str, str]]:
    return [
        (call.id, call.function.name, call.function.arguments)
        for call in message.tool_calls or []
        if isinstance(call, sdk.ChatCompletionMessageFunctionToolCall)
    ]


def test_a_calling_choice_is_a_message_with_null_content_its_reasoning_and_its_calls() -> None:
    completion = render.chat_completion(META, CALLING)

    assert completion.model_dump(mode="json")["choices"] == [
        {"index": 0, "message": WHOLE_MESSAGE, "logprobs": None, "finish_reason": "tool_calls"}
    ]


def test_a_plain_answer_keeps_its_shape_without_tool_or_reasoning_keys() -> None:
    completion = render.chat_completion(META, events(delta("Hi"), reason=FinishReason.STOP))

    assert completion.model_dump(mode="json")["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hi",
    }


def test_text_before_a_call_stays_the_content() -> None:
    call = ToolCallDelta(index=0, id="call_a", name="get_time", arguments="{}")
    completion = render.chat_completion(META, events(delta("Let me check."), delta(calls=[call])))

    message = completion.choices[0].message
    assert message.content == "Let me check."
    assert message.model_dump(mode="json")["tool_calls"][0]["function"] == {
        "name": "get_time",
        "arguments": "{}",
    }


def test_streamed_calls_take_openais_delta_shape() -> None:
    chunks = streamed(META, CALLING)

    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "The user wants ", "reasoning": "The user wants "},
        {"reasoning_content": "the weather.", "reasoning": "the weather."},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city"'},
                }
            ]
        },
        {
            "tool_calls": [
                {"index": 0, "function": {"arguments": ': "Paris"}'}},
                {
                    "index": 1,
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": ""},
                },
            ]
        },
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_sdk_reassembles_the_streamed_calls_into_the_whole_message() -> None:
    final = sdk_accumulated(streamed(META, CALLING))

    whole = sdk.ChatCompletion.model_validate(render.chat_completion(META, CALLING).model_dump(mode="json"))
    assert final.choices[0].finish_reason == "tool_calls"
    assert function_calls(final.choices[0].message) == function_calls(whole.choices[0].message)
    assert [call.model_dump() for call in whole.choices[0].message.tool_calls or []] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]


def test_a_legacy_functions_request_gets_function_call_whole_and_streamed() -> None:
    call = events(
        delta(calls=[ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"city": ')]),
        delta(calls=[ToolCallDelta(index=0, arguments='"Paris"}')]),
    )

    whole = render.chat_completion(LEGACY, call).model_dump(mode="json")["choices"][0]
    final = sdk_accumulated(streamed(LEGACY, call)).choices[0]

    assert whole["message"] == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert whole["finish_reason"] == "function_call"
    assert final.finish_reason == "function_call"
    assert final.message.function_call == sdk.chat_completion_message.FunctionCall(
        name="get_weather", arguments='{"city": "Paris"}'
    )
