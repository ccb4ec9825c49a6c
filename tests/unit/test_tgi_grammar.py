"""TGI's ``grammar`` parameter becomes the job's structured-output constraint; bad grammars are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.tgi import translate
from gateway.tgi.schema import GenerateRequest
from shared.errors import InvalidRequest
from shared.protocol import Finished, FinishReason, JsonConstraint, RegexConstraint, Usage

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def job_for(grammar: Any) -> Any:
    body = GenerateRequest.model_validate({"inputs": "Where?", "parameters": {"grammar": grammar}})
    return translate.generate_job(body, "m", "rid", 1.0, stream=False)


@pytest.mark.parametrize(
    "grammar",
    [
        {"type": "json", "value": SCHEMA},
        {"type": "json_object", "value": SCHEMA},  # TGI's alias of json
        {"type": "json", "value": json.dumps(SCHEMA)},  # TGI also parses a schema sent as text
        {"type": "json_schema", "value": {"name": "place", "schema": SCHEMA}},
    ],
)
def test_json_grammars_become_a_json_schema_constraint(grammar: dict[str, Any]) -> None:
    assert job_for(grammar).constraint == JsonConstraint(json_schema=SCHEMA, param="grammar")


def test_regex_grammar_becomes_a_regex_constraint() -> None:
    assert job_for({"type": "regex", "value": r"\d{3}"}).constraint == RegexConstraint(
        pattern=r"\d{3}", param="grammar"
    )


def test_no_grammar_leaves_the_output_free() -> None:
    assert job_for(None).constraint is None


@pytest.mark.parametrize(
    "grammar",
    [
        {"type": "regex", "value": "(unclosed"},
        {"type": "regex", "value": {"not": "a string"}},
        {"type": "json", "value": "{not json"},
        {"type": "json", "value": [1, 2]},
        {"type": "json", "value": {"type": "no-such-type"}},
        {"type": "json_schema", "value": {"name": "missing its schema"}},
    ],
)
def test_grammars_that_cannot_be_enforced_are_refused_naming_grammar(grammar: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        job_for(grammar)
    assert caught.value.param == "grammar"
    status, body = translate.tgi_error(caught.value)
    assert (status, body.error_type) == (422, "validation")


def test_a_tool_call_finish_reads_as_tgis_end_of_sequence() -> None:
    finished = Finished(
        finish_reason=FinishReason.TOOL_CALLS, usage=Usage(prompt_tokens=1, completion_tokens=1)
    )
    assert translate.finish_reason(finished) == "eos_token"
