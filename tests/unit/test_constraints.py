"""Which constraint a job's output must match: its own, its tool choice's, never both."""

from __future__ import annotations

import time

import pytest

from shared.errors import InvalidRequest
from shared.protocol import (
    ChatMessage,
    ChatPrompt,
    Constraint,
    FunctionTool,
    GenerationJob,
    JsonConstraint,
    RegexConstraint,
    TextPrompt,
    ToolChoice,
)
from shared.structured import tools
from tests.engines import request
from worker.engine.grammar import GrammarCompiler
from worker.requests.constraints import constrain, job_constraint

TOOL = FunctionTool(name="lookup", parameters={"type": "object", "properties": {"q": {"type": "string"}}})


def chat_job(
    constraint: Constraint | None = None, tool_choice: ToolChoice | None = None, tools: bool = True
) -> GenerationJob:
    prompt = ChatPrompt(messages=[ChatMessage(role="user", content="hi")], tools=[TOOL] if tools else None)
    return GenerationJob(
        request_id="r",
        model="m",
        prompt=prompt,
        created_at=time.time(),
        constraint=constraint,
        tool_choice=tool_choice,
    )


def test_a_jobs_own_constraint_is_kept_and_free_text_has_none() -> None:
    regex = RegexConstraint(pattern="a+")
    assert job_constraint(chat_job(regex)) == regex
    assert job_constraint(chat_job()) is None
    text_job = GenerationJob(request_id="r", model="m", prompt=TextPrompt(text="x"), created_at=0.0)
    assert job_constraint(text_job) is None


def test_required_and_named_tool_choices_constrain_auto_and_none_do_not() -> None:
    required = job_constraint(chat_job(tool_choice=ToolChoice(mode="required")))
    named = job_constraint(chat_job(tool_choice=ToolChoice(mode="named", name="lookup")))
    assert isinstance(required, JsonConstraint) and required.param == "tool_choice"
    # The function's own schema, closed to keys it does not declare (shared/structured/tools.py).
    assert isinstance(named, JsonConstraint) and named.json_schema == tools.closed(TOOL.parameters)
    assert job_constraint(chat_job(tool_choice=ToolChoice(mode="auto"))) is None
    assert job_constraint(chat_job(tool_choice=ToolChoice(mode="none"))) is None


def test_a_constraint_beside_a_forced_tool_call_is_refused_naming_response_format() -> None:
    with pytest.raises(InvalidRequest) as refused:
        job_constraint(chat_job(JsonConstraint(), ToolChoice(mode="required")))
    assert refused.value.param == "response_format"
    assert job_constraint(chat_job(JsonConstraint(), ToolChoice(mode="auto"))) == JsonConstraint()


def test_the_fake_engine_ignores_constraints_and_an_engine_without_grammars_refuses_them() -> None:
    engine_request = request("r", [1, 2, 3])
    assert constrain(engine_request, chat_job(RegexConstraint(pattern="a+")), None) is engine_request
    unavailable = GrammarCompiler.unavailable_because("the per-sequence engine")
    assert constrain(engine_request, chat_job(), unavailable) is engine_request
    with pytest.raises(InvalidRequest, match="per-sequence engine") as refused:
        constrain(engine_request, chat_job(RegexConstraint(pattern="a+")), unavailable)
    assert refused.value.param == "structured_outputs.regex"
