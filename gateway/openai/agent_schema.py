"""Owns the request models of agent features: tools and legacy functions, tool choices, response formats
and vLLM's structured-output extras.

``gateway/openai/schema.py`` composes its request bodies from these;
``gateway/openai/agent_translate.py`` turns them into the job's tools, tool choice
and constraint. A tool choice is checked by a before-validator rather than declared
as a union, so a bad one is one sentence naming ``tool_choice``, not one error per
union branch with the branch names in its location. ``response_format`` is one model
with an optional ``json_schema`` for the same reason (a discriminated union puts its
tag in every error's location).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

# OpenAI's rule for function names, which templates and parsers can rely on.
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# More tools than any template renders usefully; each is compiled into a grammar when required.
MAX_TOOLS = 128
# vLLM's structured-output backends, and the ones tokenferry honours (it has one: llguidance).
HONOURED_BACKENDS = frozenset({"auto", "guidance", "llguidance"})


class _Param(BaseModel):
    # Nested objects tolerate keys they do not know: clients replay whole objects they were sent.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


FunctionName = Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN, description="a-z, A-Z, 0-9, _ and -.")]


class FunctionDefinition(_Param):
    name: FunctionName
    description: str | None = Field(None, description="What the function does, for the model.")
    parameters: dict[str, Any] | None = Field(
        None, description="JSON schema of the arguments object; absent: any object."
    )
    strict: bool | None = Field(
        None, description="Accepted; arguments are always generated to match the schema when required."
    )


class ToolParam(_Param):
    type: Literal["function"] = Field(description="Only function tools are supported.")
    function: FunctionDefinition


Tools = Annotated[
    list[ToolParam] | None,
    Field(max_length=MAX_TOOLS, description="Functions the model may call."),
]
Functions = Annotated[
    list[FunctionDefinition] | None,
    Field(max_length=MAX_TOOLS, description="Deprecated form of tools; answered with message.function_call."),
]


class NamedFunction(_Param):
    name: FunctionName


class NamedToolChoice(_Param):
    type: Literal["function"]
    function: NamedFunction


ToolChoiceMode = Literal["none", "auto", "required"]


def _choice(value: Any, modes: tuple[str, ...], named: Any) -> Any:
    if value is None or value in modes:
        return value
    if isinstance(value, dict):
        return named(value)
    raise PydanticCustomError(
        "invalid_tool_choice",
        "Expected one of {modes} or an object naming a function.",
        {"modes": ", ".join(repr(mode) for mode in modes)},
    )


def _named_tool(value: dict[str, Any]) -> NamedToolChoice:
    function = value.get("function")
    if value.get("type") != "function" or not isinstance(function, dict) or "name" not in function:
        raise PydanticCustomError(
            "invalid_tool_choice",
            'A named tool choice is {"type": "function", "function": {"name": ...}}; '
            "other kinds (allowed_tools, custom) are not supported.",
        )
    return NamedToolChoice.model_validate(value)


def _named_function(value: dict[str, Any]) -> NamedFunction:
    return NamedFunction.model_validate(value)


def check_tool_choice(value: Any) -> Any:
    return _choice(value, ("none", "auto", "required"), _named_tool)


def check_function_call(value: Any) -> Any:
    return _choice(value, ("none", "auto"), _named_function)


ToolChoice = Annotated[
    ToolChoiceMode | NamedToolChoice | None,
    BeforeValidator(check_tool_choice),
    Field(description="none, auto (the default with tools), required, or a named function."),
]
FunctionCall = Annotated[
    Literal["none", "auto"] | NamedFunction | None,
    BeforeValidator(check_function_call),
    Field(description="Deprecated form of tool_choice: none, auto or {'name': ...}."),
]


class JsonSchemaFormat(_Param):
    name: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN, description="The format's name.")]
    description: str | None = None
    # ``schema`` would shadow a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] | None = Field(
        None, alias="schema", description="The JSON schema the output must match; absent: any object."
    )
    strict: bool | None = Field(None, description="Accepted; the schema is always enforced.")


class ResponseFormat(_Param):
    type: Literal["text", "json_object", "json_schema"] = Field(
        description="text, json_object (any JSON object) or json_schema (enforced while generating)."
    )
    json_schema: JsonSchemaFormat | None = Field(None, description="Required with type json_schema.")

    @model_validator(mode="after")
    def _schema_when_asked(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise PydanticCustomError(
                "missing_json_schema", "response_format of type json_schema needs a json_schema object."
            )
        return self


class _Strict(BaseModel):
    # An unknown key here asks for a constraint we would otherwise drop.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Backend = Annotated[
    str | None,
    Field(description="auto, guidance or llguidance (tokenferry enforces with llguidance)."),
]
GuidedJson = Annotated[
    dict[str, Any] | str | None, Field(description="A JSON schema (an object, or its JSON text).")
]
GuidedChoice = Annotated[list[str] | None, Field(min_length=1, description="The output is one of these.")]


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs``: exactly one of json, regex, choice, grammar, json_object."""

    json_: GuidedJson = Field(None, alias="json")
    regex: str | None = Field(None, description="A regular expression the whole output matches.")
    choice: GuidedChoice = None
    grammar: str | None = Field(None, description="A Lark (llguidance) or GBNF grammar.")
    json_object: bool | None = Field(None, description="true: any JSON object.")
    backend: Backend = None
    disable_fallback: bool | None = Field(None, description="Accepted: there is no fallback backend.")
    disable_any_whitespace: bool | None = Field(
        None, description="Accepted: JSON is always generated compact."
    )


# Calls in an agent's history: an assistant message's calls, answered by ``tool`` messages.


class CalledFunction(_Param):
    name: str
    arguments: str = Field(description="The arguments as JSON text, as the model generated them.")


class MessageToolCall(_Param):
    id: str = Field(description="Answered by the tool message with this tool_call_id.")
    type: Literal["function"] = "function"
    function: CalledFunction


MessageToolCalls = Annotated[
    list[MessageToolCall] | None,
    Field(max_length=MAX_TOOLS, description="The assistant's calls (content may then be null)."),
]
