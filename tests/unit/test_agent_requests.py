"""Agent fields of OpenAI requests become the job's tools, tool choice, constraint and template kwargs,
and every request the worker could not honour is refused by name before queueing."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.openai import translate
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from shared.errors import InvalidRequest
from shared.protocol import (
    ChatMessage,
    ChoiceConstraint,
    FunctionTool,
    GenerationJob,
    GrammarConstraint,
    JsonConstraint,
    RegexConstraint,
    ToolCall,
    ToolChoice,
)
from shared.structured import tools

REQUEST_ID = "0123456789abcdef0123456789abcdef"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Now, somewhere."}}
WEATHER_TOOL = FunctionTool(name="get_weather", parameters=WEATHER_PARAMETERS)
TIME_TOOL = FunctionTool(name="get_time", description="Now, somewhere.")
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def chat_job(**fields: Any) -> GenerationJob:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return translate.chat_job(ChatCompletionRequest.model_validate(body), REQUEST_ID, 1.0)


def completion_jobs(**fields: Any) -> list[GenerationJob]:
    request = CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"], **fields})
    return translate.completion_jobs(request, REQUEST_ID, 1.0)


def refused_param(**fields: Any) -> str | None:
    with pytest.raises(InvalidRequest) as caught:
        chat_job(**fields)
    return caught.value.param


def invalid_param(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        chat_job(**fields)
    return ".".join(str(part) for part in caught.value.errors()[0]["loc"])


# Tools and tool choices


def test_tools_reach_the_template_and_the_model_chooses_by_default() -> None:
    job = chat_job(tools=[WEATHER, TIME])

    assert job.prompt.kind == "chat"
    assert job.prompt.tools == [WEATHER_TOOL, TIME_TOOL]
    assert job.tool_choice == ToolChoice(mode="auto", parallel=True)
    assert job.constraint is None


def test_required_choice_constrains_the_output_to_a_list_of_calls() -> None:
    job = chat_job(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)

    choice = ToolChoice(mode="required", parallel=False)
    assert job.tool_choice == choice
    # The worker derives the constraint from the tool choice: the job carries no second copy.
    assert job.constraint is None
    constraint = tools.call_constraint([WEATHER_TOOL, TIME_TOOL], choice)
    assert constraint is not None and constraint.json_schema is not None
    assert constraint.json_schema["maxItems"] == 1


def test_named_choice_constrains_the_output_to_that_functions_arguments() -> None:
    job = chat_job(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )

    assert job.tool_choice == ToolChoice(mode="named", name="get_weather", parallel=True)
    assert job.constraint is None
    assert tools.call_constraint([WEATHER_TOOL, TIME_TOOL], job.tool_choice) == JsonConstraint(
        json_schema={**WEATHER_PARAMETERS, "additionalProperties": False}, param="tool_choice"
    )


def test_choice_none_keeps_the_tools_in_the_template_but_parses_no_call() -> None:
    job = chat_job(tools=[WEATHER], tool_choice="none")

    assert job.prompt.kind == "chat" and job.prompt.tools == [WEATHER_TOOL]
    assert job.tool_choice == ToolChoice(mode="none")
    assert job.constraint is None


@pytest.mark.parametrize(
    "fields", [{}, {"tools": []}, {"tools": [], "tool_choice": "none"}, {"tool_choice": "auto"}]
)
def test_no_tools_means_no_tool_choice(fields: dict[str, Any]) -> None:
    job = chat_job(**fields)

    assert job.tool_choice is None
    assert job.prompt.kind == "chat" and job.prompt.tools is None


def test_legacy_functions_take_the_tools_path_with_one_call_at_most() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hi"}],
            "functions": [WEATHER["function"]],
            "function_call": {"name": "get_weather"},
        }
    )

    job = translate.chat_job(request, REQUEST_ID, 1.0)

    assert job.prompt.kind == "chat" and job.prompt.tools == [WEATHER_TOOL]
    assert job.tool_choice == ToolChoice(mode="named", name="get_weather", parallel=False)
    assert job.constraint is None
    assert translate.chat_meta(request, REQUEST_ID, 1.0).legacy_functions is True


def test_an_agents_history_reaches_the_template_with_its_calls_and_results() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21 C"}]},
    ]

    job = chat_job(messages=messages, tools=[WEATHER])

    assert job.prompt.kind == "chat"
    assert job.prompt.messages[1:] == [
        ChatMessage(
            role="assistant",
            content=None,
            tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')],
        ),
        ChatMessage(role="tool", content="21 C", tool_call_id="call_1"),
    ]


def test_a_legacy_history_becomes_tool_calls_and_tool_results() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}},
        {"role": "function", "name": "get_weather", "content": "21 C"},
    ]

    job = chat_job(messages=messages, functions=[WEATHER["function"]])

    assert job.prompt.kind == "chat"
    assert job.prompt.messages[1:] == [
        ChatMessage(
            role="assistant",
            content=None,
            tool_calls=[ToolCall(id="call_legacy_1", name="get_weather", arguments="{}")],
        ),
        ChatMessage(role="tool", content="21 C", name="get_weather", tool_call_id="call_legacy_1"),
    ]


# Structured outputs


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, JsonConstraint(param="response_format")),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}},
            JsonConstraint(json_schema=PERSON, param="response_format.json_schema.schema"),
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "anything"}}},
            JsonConstraint(param="response_format.json_schema.schema"),
        ),
        (
            {"structured_outputs": {"json": PERSON}},
            JsonConstraint(json_schema=PERSON, param="structured_outputs.json"),
        ),
        ({"structured_outputs": {"regex": "[0-9]+"}}, RegexConstraint(pattern="[0-9]+")),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, ChoiceConstraint(choices=["yes", "no"])),
        ({"structured_outputs": {"grammar": 'start: "a"+'}}, GrammarConstraint(grammar='start: "a"+')),
        (
            {"structured_outputs": {"json_object": True}},
            JsonConstraint(param="structured_outputs.json_object"),
        ),
        (
            {"structured_outputs": {"regex": "a", "backend": "guidance", "disable_any_whitespace": True}},
            RegexConstraint(pattern="a"),
        ),
        ({"guided_json": PERSON}, JsonConstraint(json_schema=PERSON, param="guided_json")),
        (
            {"guided_json": '{"type": "object"}'},
            JsonConstraint(json_schema={"type": "object"}, param="guided_json"),
        ),
        (
            {"guided_regex": "[a-z]+", "guided_decoding_backend": "auto"},
            RegexConstraint(pattern="[a-z]+", param="guided_regex"),
        ),
        ({"guided_choice": ["a", "b"]}, ChoiceConstraint(choices=["a", "b"], param="guided_choice")),
        (
            {"guided_grammar": 'root ::= "x"'},
            GrammarConstraint(grammar='root ::= "x"', param="guided_grammar"),
        ),
    ],
)
def test_each_structured_output_field_becomes_the_jobs_constraint(
    fields: dict[str, Any], constraint: Any
) -> None:
    assert chat_job(**fields).constraint == constraint
    assert [job.constraint for job in completion_jobs(**fields)] == [constraint, constraint]


def test_template_kwargs_and_reasoning_effort_reach_the_template() -> None:
    job = chat_job(
        chat_template_kwargs={"enable_thinking": False}, reasoning_effort="low", add_generation_prompt=False
    )

    assert job.prompt.kind == "chat"
    assert job.prompt.template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    assert job.prompt.add_generation_prompt is False


def test_chat_template_kwargs_win_over_reasoning_effort() -> None:
    job = chat_job(chat_template_kwargs={"reasoning_effort": "high"}, reasoning_effort="low")

    assert job.prompt.kind == "chat" and job.prompt.template_kwargs == {"reasoning_effort": "high"}


# Refusals found by translation: each names its parameter


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
        ({"structured_outputs": {"json": {"$ref": "#/nowhere"}}}, "structured_outputs.json"),
        ({"guided_regex": "("}, "guided_regex"),
        ({"structured_outputs": {"grammar": "start: ("}}, "structured_outputs.grammar"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_json": "[1]"}, "guided_json"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
        ({"guided_choice": ["a"], "guided_grammar": 'start: "a"'}, "guided_grammar"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "guided_json": PERSON,
            },
            "guided_json",
        ),
        ({"guided_regex": "a", "guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
        ({"structured_outputs": {"regex": "a", "backend": "outlines"}}, "structured_outputs.backend"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
            "tools.0.function.parameters",
        ),
        ({"functions": [{"name": "f", "parameters": {"type": "nonsense"}}]}, "functions.0.parameters"),
        ({"functions": [WEATHER["function"]], "function_call": {"name": "nope"}}, "function_call"),
        ({"tools": [WEATHER], "functions": [WEATHER["function"]]}, "functions"),
        ({"tools": [WEATHER], "tool_choice": "auto", "function_call": "auto"}, "function_call"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_param(fields: dict[str, Any], param: str) -> None:
    assert refused_param(**fields) == param


def test_a_completion_with_two_constraints_is_refused_like_a_chat() -> None:
    with pytest.raises(InvalidRequest) as caught:
        completion_jobs(guided_regex="a", structured_outputs={"choice": ["a"]})

    assert caught.value.param == "guided_regex"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools.0.type"),
        ({"tool_choice": "any"}, "tool_choice"),
        (
            {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}},
            "tool_choice",
        ),
        ({"function_call": "required"}, "function_call"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
            "response_format.json_schema.name",
        ),
        ({"response_format": {"type": "structural_tag"}}, "response_format.type"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"guided_choice": []}, "guided_choice"),
        ({"reasoning_effort": "ultra"}, "reasoning_effort"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.0"),
        ({"messages": [{"role": "user"}]}, "messages.0"),
        ({"messages": [{"role": "tool", "content": "21 C"}]}, "messages.0"),
        ({"messages": [{"role": "function", "content": "21 C"}]}, "messages.0"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}]},
            "messages.0.tool_calls.0.function",
        ),
    ],
)
def test_malformed_agent_fields_are_refused_naming_the_param(fields: dict[str, Any], param: str) -> None:
    assert invalid_param(**fields) == param
