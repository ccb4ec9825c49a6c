"""Owns what a tool choice asks of the output: the JSON a constrained call must be, and tool checks.

``required`` and a named choice are enforced by constrained decoding, as vLLM does,
independent of any model family's call syntax: a named choice generates the
function's arguments object itself; ``required`` generates a JSON list of
``{"name": ..., "arguments": {...}}`` (one item at most unless parallel calls are
allowed). The worker reads that JSON back as calls. ``auto`` is left to the
worker's tool-call parser (``worker/requests/tool_calls/``).

Intentional divergence: a forced call's objects take only the properties they
declare, unless their schema says otherwise (``additionalProperties``). JSON
Schema allows extra keys by default, and LangChain's tool schemas never close
them, so a small model forced to call ``get_weather(city)`` wrote
``{"city": "Paris", "weather": "<a paragraph>"}`` until ``max_tokens`` cut it.
A function cannot take keys it does not declare, so nothing valid is lost.
"""

from __future__ import annotations

from typing import Any

from shared.errors import InvalidRequest
from shared.protocol import FunctionTool, JsonConstraint, ToolChoice
from shared.structured.grammars import ANY_OBJECT, json_grammar, problem_of


def parameters_schema(tool: FunctionTool) -> dict[str, Any]:
    """The arguments' schema; a function without one takes any object."""
    return tool.parameters if tool.parameters is not None else ANY_OBJECT


def closed(schema: Any) -> Any:
    """``schema`` with every object that declares ``properties`` closed to others, unless it says."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: _closed_keyword(key, value) for key, value in schema.items()}
    if "properties" in result and "additionalProperties" not in result:
        result["additionalProperties"] = False
    return result


# Keywords whose values are schemas, or maps or lists of schemas; everything else is data (enum, const...).
_SUBSCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})
_SUBSCHEMAS = frozenset({"items", "anyOf", "oneOf", "allOf", "prefixItems", "not", "additionalProperties"})


def _closed_keyword(key: str, value: Any) -> Any:
    if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
        return {name: closed(sub) for name, sub in value.items()}
    if key in _SUBSCHEMAS:
        return closed(value)
    return value


def call_constraint(tools: list[FunctionTool], choice: ToolChoice) -> JsonConstraint | None:
    """The JSON the output must be for ``choice``; None when the model chooses freely."""
    if choice.mode == "named":
        tool = next(tool for tool in tools if tool.name == choice.name)
        return JsonConstraint(json_schema=closed(parameters_schema(tool)), param="tool_choice")
    if choice.mode != "required":
        return None
    calls: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"anyOf": [_call_schema(tool) for tool in tools]},
    }
    if not choice.parallel:
        calls["maxItems"] = 1
    return JsonConstraint(json_schema=calls, param="tool_choice")


def _call_schema(tool: FunctionTool) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": closed(parameters_schema(tool))},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def check_tools(tools: list[FunctionTool], choice: ToolChoice, param: str = "tools") -> None:
    """Refuse duplicate names, a named choice that names no tool and parameters that do not compile."""
    names = [tool.name for tool in tools]
    for index, tool in enumerate(tools):
        if names.index(tool.name) != index:
            raise InvalidRequest(f"Two tools are named '{tool.name}'; names must be unique.", param=param)
        where = f"{param}.{index}.function.parameters"
        if tool.parameters is not None:
            problem = problem_of(json_grammar(tool.parameters, where))
            if problem:
                raise InvalidRequest(
                    f"{where} is not a JSON schema tokenferry can enforce: {problem.strip().splitlines()[0]}",
                    param=where,
                )
    if choice.mode == "named" and choice.name not in names:
        raise InvalidRequest(
            f"tool_choice names the function '{choice.name}', which is not among the tools.",
            param="tool_choice",
        )
    if choice.mode in ("required", "named") and not tools:
        raise InvalidRequest(f"tool_choice '{choice.mode}' needs at least one tool.", param="tool_choice")
