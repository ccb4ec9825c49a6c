"""Responses API translation: request -> job (every mapping and refusal); conversations from items."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.http.errors import validation_error
from gateway.responses_api.schema import ResponseCreateRequest
from gateway.responses_api.translate import conversation, pending_response, response_job
from shared.errors import InvalidRequest
from shared.protocol import ChatMessage, FunctionTool, JsonConstraint, ToolCall, ToolChoice

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather now", "parameters": WEATHER}
FUNCTION = FunctionTool(name="get_weather", description="Weather now", parameters=WEATHER)


def request(**fields: object) -> ResponseCreateRequest:
    return ResponseCreateRequest.model_validate({"model": "m", "input": "Hi", **fields})


def messages_of(**fields: object) -> list[ChatMessage]:
    return response_job(request(**fields), "rid", 1.0).prompt.messages  # type: ignore[union-attr]


def test_instructions_become_a_system_message_before_the_input() -> None:
    job = response_job(request(instructions="Be brief.", max_output_tokens=7, temperature=0.5), "rid", 1.0)
    assert job.prompt.messages == [  # type: ignore[union-attr]
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Hi"),
    ]
    assert (job.sampling.max_tokens, job.sampling.temperature) == (7, 0.5)
    assert (job.tool_choice, job.constraint, job.prompt.tools) == (None, None, None)  # type: ignore[union-attr]


def test_message_list_input_joins_text_parts() -> None:
    messages = [
        {"role": "developer", "content": "Rules"},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
    ]
    assert messages_of(input=messages) == [
        ChatMessage(role="system", content="Rules"),
        ChatMessage(role="user", content="a\nb"),
    ]


# Tools and tool choices


def test_function_tools_reach_the_template_and_the_model_chooses_by_default() -> None:
    job = response_job(request(tools=[TOOL]), "rid", 1.0)
    assert job.prompt.tools == [FUNCTION]  # type: ignore[union-attr]
    assert job.tool_choice == ToolChoice(mode="auto", parallel=True)
    assert job.constraint is None  # auto: the worker's parser finds calls in free text


def test_tool_choice_none_keeps_the_tools_but_parses_no_call() -> None:
    job = response_job(request(tools=[TOOL], tool_choice="none"), "rid", 1.0)
    assert job.tool_choice == ToolChoice(mode="none") and job.constraint is None


def test_required_without_parallel_calls_asks_the_worker_for_one_call() -> None:
    job = response_job(request(tools=[TOOL], tool_choice="required", parallel_tool_calls=False), "rid", 1.0)
    assert job.tool_choice == ToolChoice(mode="required", parallel=False)
    # The worker derives the call's constraint from the tool choice; the job carries only text.format's.
    assert job.constraint is None


def test_a_named_function_is_a_named_tool_choice() -> None:
    job = response_job(
        request(tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"}), "rid", 1.0
    )
    assert job.tool_choice == ToolChoice(mode="named", name="get_weather")
    assert job.constraint is None


# text.format


@pytest.mark.parametrize(
    ("text_format", "constraint"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, JsonConstraint(json_schema=None, param="text.format")),
        (
            {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True},
            JsonConstraint(json_schema=WEATHER, param="text.format.schema"),
        ),
    ],
)
def test_text_format_becomes_the_constraint(text_format: dict[str, Any], constraint: object) -> None:
    assert response_job(request(text={"format": text_format}), "rid", 1.0).constraint == constraint


def test_the_response_echoes_tools_choice_and_format() -> None:
    text = {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}}
    pending = pending_response(
        request(tools=[TOOL], tool_choice="required", parallel_tool_calls=False, text=text, store=False),
        "rid",
        1.0,
    )
    assert (pending.tools, pending.tool_choice, pending.parallel_tool_calls) == ([TOOL], "required", False)
    assert (pending.text, pending.store) == (text, False)


# Refusals: what the job cannot honour is a 400 naming the parameter


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function"}]}, "tools.0.name"),
        ({"tools": [TOOL, TOOL]}, "tools"),
        ({"tools": [{**TOOL, "parameters": {"type": "no-such-type"}}]}, "tools.0.parameters"),
        ({"tools": [TOOL], "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "w"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}}, "text.format.schema"),
        (
            {"tools": [TOOL], "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
            "text.format",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_its_parameter(
    fields: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        response_job(request(**fields), "rid", 1.0)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"truncation": "auto"}, "truncation"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input.0"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0"),
    ],
)
def test_fields_we_do_not_honour_are_refused_by_the_schema(fields: dict[str, object], param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        request(**fields)
    assert validation_error(caught.value.errors()).param == param


def test_fields_asking_nothing_are_accepted() -> None:
    request(reasoning={}, include=[], truncation="disabled", service_tier="auto", top_logprobs=0, user="u")


# Conversations: input items and previous responses


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}
REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "x"}],
}


def test_function_calls_and_their_outputs_become_assistant_tool_calls_and_tool_messages() -> None:
    items = [{"role": "user", "content": "Weather?"}, REASONING, CALL, OUTPUT]
    assert messages_of(input=items) == [
        ChatMessage(role="user", content="Weather?"),
        ChatMessage(
            role="assistant",
            content=None,
            tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')],
        ),
        ChatMessage(role="tool", content="18 C", tool_call_id="call_1", name="get_weather"),
    ]


def test_calls_after_an_assistant_message_join_it_as_one_turn() -> None:
    second = {**CALL, "call_id": "call_2", "arguments": '{"city": "Oslo"}'}
    items = [{"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]}, CALL, second]
    [turn] = messages_of(input=items)
    assert turn.content == "Checking." and [call.id for call in turn.tool_calls or []] == ["call_1", "call_2"]


def test_a_continuation_puts_the_stored_conversation_before_the_input_and_names_its_calls() -> None:
    history = [ChatMessage(role="user", content="Weather?"), ChatMessage(role="assistant", content=None,
               tool_calls=[ToolCall(id="call_1", name="get_weather", arguments="{}")])]  # fmt: skip
    body = request(instructions="Be brief.", input=[OUTPUT], previous_response_id="resp_1")
    job = response_job(body, "rid", 1.0, history)
    tool_message = ChatMessage(role="tool", content="18 C", tool_call_id="call_1", name="get_weather")
    assert job.prompt.messages == [  # type: ignore[union-attr]
        ChatMessage(role="system", content="Be brief."),
        *history,
        tool_message,
    ]
    # What is stored for the next continuation leaves the instructions out, as OpenAI does.
    assert conversation(body, history) == [*history, tool_message]
