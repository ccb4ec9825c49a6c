"""Owns turning a request's agent fields into the job's tools, tool choice, constraint and template kwargs.

Pure, like ``gateway/openai/translate.py`` (which calls it for chat and completions
requests and batch lines alike), and it refuses here, before anything is queued,
what the worker could not honour: a schema, regex or grammar that does not compile
(``shared/structured/grammars.check``), a bad tool list
(``shared/structured/tools.check_tools``), or two sources constraining one output
(``response_format`` with ``guided_regex``, or a ``required`` tool choice with a
JSON ``response_format``): each is a 400 naming the parameter.

A ``required`` or named tool choice is checked here to compile
(``shared/structured/tools.call_constraint``) but travels only as the job's
``tool_choice``: the worker derives the same constraint from it and reads the
output back as calls, one rule for every API that takes tools. The deprecated ``functions`` and
``function_call`` take the same path with one call at most, and the answer comes back
in their own shape (``message.function_call``, see ``legacy_functions``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.openai.agent_schema import (
    HONOURED_BACKENDS,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    StructuredOutputs,
)
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from shared.errors import InvalidRequest
from shared.protocol import (
    ChoiceConstraint,
    Constraint,
    FunctionTool,
    GrammarConstraint,
    JsonConstraint,
    RegexConstraint,
    ToolChoice,
)
from shared.structured import grammars, tools


@dataclass(frozen=True, slots=True)
class ToolSetup:
    """What a chat request's tools ask of its job."""

    tools: list[FunctionTool] | None = None
    choice: ToolChoice | None = None
    constraint: Constraint | None = None


def legacy_functions(request: ChatCompletionRequest) -> bool:
    """Whether the request used the deprecated ``functions`` (answered with ``function_call``)."""
    return bool(request.functions)


def tool_setup(request: ChatCompletionRequest) -> ToolSetup:
    """The job's tools, tool choice and the constraint a required or named choice puts on the output."""
    if request.tools and request.functions:
        raise InvalidRequest("Give tools or the deprecated functions, not both.", param="functions")
    if request.tool_choice is not None and request.function_call is not None:
        raise InvalidRequest(
            "Give tool_choice or the deprecated function_call, not both.", param="function_call"
        )
    param = "functions" if request.functions else "tools"
    definitions = request.functions or [tool.function for tool in request.tools or []]
    choice = _legacy_choice(request) if request.functions else _tool_choice(request)
    function_tools = [_function_tool(definition) for definition in definitions]
    if not function_tools and (choice is None or choice.mode in ("none", "auto")):
        return ToolSetup()  # `tools: []` and a choice of none or auto: several clients always send them
    assert choice is not None  # a required or named choice without tools is refused by check_tools
    _check_tools(function_tools, choice, param)
    constraint = tools.call_constraint(function_tools, choice)
    if constraint is not None:
        grammars.check(constraint)
    return ToolSetup(tools=function_tools, choice=choice, constraint=constraint)


def _check_tools(function_tools: list[FunctionTool], choice: ToolChoice, param: str) -> None:
    try:
        tools.check_tools(function_tools, choice, param)
    except InvalidRequest as error:
        if param != "functions" or error.param is None:
            raise
        # The deprecated fields' names: function_call, and functions.<i>.parameters (no .function).
        where = error.param.replace(".function.parameters", ".parameters").replace(
            "tool_choice", "function_call"
        )
        raise InvalidRequest(error.message.replace(error.param, where), param=where) from error


def _tool_choice(request: ChatCompletionRequest) -> ToolChoice:
    parallel = request.parallel_tool_calls is not False
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        return ToolChoice(mode="named", name=choice.function.name, parallel=parallel)
    return ToolChoice(mode=choice or "auto", parallel=parallel)


def _legacy_choice(request: ChatCompletionRequest) -> ToolChoice:
    # The deprecated API answers with one function_call: never several.
    choice = request.function_call
    if isinstance(choice, NamedFunction):
        return ToolChoice(mode="named", name=choice.name, parallel=False)
    return ToolChoice(mode=choice or "auto", parallel=False)


def _function_tool(definition: FunctionDefinition) -> FunctionTool:
    return FunctionTool(
        name=definition.name,
        description=definition.description,
        parameters=definition.parameters,
        strict=definition.strict,
    )


def job_constraint(request: ChatCompletionRequest | CompletionRequest, setup: ToolSetup) -> Constraint | None:
    """The one constraint on the output, checked to compile; a 400 when two sources ask for one."""
    _check_backends(request)
    sources = output_constraints(request)
    if setup.constraint is not None and sources:
        raise InvalidRequest(
            f"{sources[0].param} cannot constrain the output while tool_choice requires a call "
            "(the call's arguments are the output).",
            param=sources[0].param,
        )
    if len(sources) > 1:
        raise InvalidRequest(
            f"Only one structured-output parameter may constrain the output; got {sources[0].param} "
            f"and {sources[1].param}.",
            param=sources[1].param,
        )
    if not sources:
        return None  # a forced call's constraint is the worker's to derive from the tool choice
    grammars.check(sources[0])
    return sources[0]


def output_constraints(request: ChatCompletionRequest | CompletionRequest) -> list[Constraint]:
    """Every constraint the request's response_format, structured_outputs and guided_* fields ask for."""
    found: list[Constraint] = []
    response_format = request.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(JsonConstraint(param="response_format"))
    if response_format is not None and response_format.type == "json_schema" and response_format.json_schema:
        schema = response_format.json_schema.schema_
        found.append(JsonConstraint(json_schema=schema, param="response_format.json_schema.schema"))
    if request.structured_outputs is not None:
        found.extend(_structured(request.structured_outputs))
    found.extend(_guided(request))
    return found


def _structured(outputs: StructuredOutputs) -> list[Constraint]:
    found: list[Constraint] = []
    if outputs.json_ is not None:
        found.append(_json("structured_outputs.json", outputs.json_))
    if outputs.regex is not None:
        found.append(RegexConstraint(pattern=outputs.regex, param="structured_outputs.regex"))
    if outputs.choice is not None:
        found.append(ChoiceConstraint(choices=outputs.choice, param="structured_outputs.choice"))
    if outputs.grammar is not None:
        found.append(GrammarConstraint(grammar=outputs.grammar, param="structured_outputs.grammar"))
    if outputs.json_object:
        found.append(JsonConstraint(param="structured_outputs.json_object"))
    return found


def _guided(request: ChatCompletionRequest | CompletionRequest) -> list[Constraint]:
    found: list[Constraint] = []
    if request.guided_json is not None:
        found.append(_json("guided_json", request.guided_json))
    if request.guided_regex is not None:
        found.append(RegexConstraint(pattern=request.guided_regex, param="guided_regex"))
    if request.guided_choice is not None:
        found.append(ChoiceConstraint(choices=request.guided_choice, param="guided_choice"))
    if request.guided_grammar is not None:
        found.append(GrammarConstraint(grammar=request.guided_grammar, param="guided_grammar"))
    return found


def _json(param: str, schema: dict[str, Any] | str) -> JsonConstraint:
    # vLLM accepts a schema as its JSON text too.
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise InvalidRequest(f"{param} is not valid JSON: {error}.", param=param) from error
        if not isinstance(schema, dict):
            raise InvalidRequest(f"{param} must be a JSON schema object.", param=param)
    return JsonConstraint(json_schema=schema, param=param)


def _check_backends(request: ChatCompletionRequest | CompletionRequest) -> None:
    asked = {"guided_decoding_backend": request.guided_decoding_backend}
    if request.structured_outputs is not None:
        asked["structured_outputs.backend"] = request.structured_outputs.backend
    for param, backend in asked.items():
        if backend is not None and backend not in HONOURED_BACKENDS:
            raise InvalidRequest(
                f"{param} '{backend}' is not available: tokenferry enforces structured outputs with "
                "llguidance (give auto, guidance or llguidance, or leave it out).",
                param=param,
            )


def template_kwargs(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """chat_template_kwargs, with reasoning_effort as the variable of that name unless they set it."""
    kwargs = dict(request.chat_template_kwargs or {})
    if request.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", request.reasoning_effort)
    return kwargs or None
