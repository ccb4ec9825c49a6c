"""A forced call's arguments take only the keys the function declares, unless its schema allows more."""

from __future__ import annotations

import json
import uuid
from typing import Any

import jsonschema
import llguidance
import pytest

from shared.errors import InvalidRequest
from shared.protocol import FunctionTool, JsonConstraint, RegexConstraint, ToolChoice
from shared.structured import grammars, tools

NESTED = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
        "stops": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
        "either": {"anyOf": [{"type": "object", "properties": {"a": {"const": {"properties": 1}}}}]},
    },
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    "required": ["city"],
}


def test_every_object_declaring_properties_is_closed_and_data_is_left_alone() -> None:
    result = tools.closed(NESTED)

    assert result["additionalProperties"] is False
    assert result["properties"]["where"]["additionalProperties"] is False
    assert result["properties"]["stops"]["items"]["additionalProperties"] is False
    assert result["$defs"]["point"]["additionalProperties"] is False
    assert result["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    # What the schema says wins; a const's value is data, not a schema.
    assert result["properties"]["extra"]["additionalProperties"] == {"type": "integer"}
    assert result["properties"]["either"]["anyOf"][0]["properties"]["a"] == {"const": {"properties": 1}}
    assert "additionalProperties" not in NESTED  # the caller's schema is not changed


def test_a_forced_call_cannot_add_keys_the_function_does_not_take() -> None:
    tool = FunctionTool(
        name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}
    )
    constraint = tools.call_constraint([tool], ToolChoice(mode="named", name="get_weather"))
    assert constraint is not None

    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))
    matcher = llguidance.LLMatcher(tokenizer, grammars.check(constraint))
    accepted = matcher.try_consume_tokens(list(b'{"city": "Paris", "weather": "x"}'))

    assert accepted == len(b'{"city": "Paris"')  # the comma opening a second key is refused
    assert jsonschema.Draft202012Validator(constraint.json_schema).is_valid(json.loads('{"city": "Paris"}'))


class _ByteTokenizer:
    """One token per byte, plus an EOS: enough for llguidance to walk a grammar byte by byte."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([byte]) for byte in range(256)] + [b"</s>"]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


def test_a_grammar_is_validated_once_however_often_it_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    validate = llguidance.LLMatcher.validate_grammar

    def counting(grammar: str, *args: Any, **kwargs: Any) -> str:
        calls.append(grammar)
        return validate(grammar, *args, **kwargs)

    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar", counting)
    # Names no other test uses: the cache lives as long as the process.
    unique = uuid.uuid4().hex
    schema = {"type": "object", "properties": {f"once_{unique}": {"type": "integer"}}}
    for _ in range(3):
        grammars.check(JsonConstraint(json_schema=schema))
    with pytest.raises(InvalidRequest):
        grammars.check(RegexConstraint(pattern=f"{unique}(unclosed"))
    with pytest.raises(InvalidRequest):  # a refusal is remembered too, and still refused
        grammars.check(RegexConstraint(pattern=f"{unique}(unclosed"))

    assert len(calls) == 2
