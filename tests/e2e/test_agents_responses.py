"""Agents' surface with the real model: Responses text.format and function tools through the official
openai SDK, TGI's grammar through huggingface_hub, and a batch whose lines ask for JSON and a named call.

Each output is checked the way its user would: parsed as JSON and validated against the
schema asked for (``jsonschema``). These need the worker's constrained decoding and
tool-call output; SmolLM2-135M alone would not keep to a schema.
"""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

import huggingface_hub.constants
import jsonschema
import openai
import pytest
from huggingface_hub import InferenceClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city.",
    "parameters": CITY,
    "strict": True,
}
ASK_WEATHER = "What is the weather in Paris right now?"
BATCH_TIMEOUT_S = 600.0


def test_text_format_json_schema_answers_json_matching_the_schema(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(
        model=model,
        input="What is the capital of France? Answer in JSON.",
        text={"format": {"type": "json_schema", "name": "capital", "schema": CITY, "strict": True}},
        temperature=0,
        max_output_tokens=60,
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), CITY)


def test_a_named_function_is_called_with_valid_arguments_and_its_output_continues(
    client: openai.OpenAI, model: str
) -> None:
    response = client.responses.create(
        model=model,
        input=ASK_WEATHER,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=60,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), CITY)

    answer = client.responses.create(
        model=model,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="none",
        temperature=0,
        max_output_tokens=40,
    )
    assert answer.status in ("completed", "incomplete") and answer.output_text.strip()


def test_a_streamed_named_call_streams_its_arguments(client: openai.OpenAI, model: str) -> None:
    events = list(
        client.responses.create(
            model=model,
            input=ASK_WEATHER,
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            temperature=0,
            max_output_tokens=60,
            stream=True,
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == deltas
    jsonschema.validate(json.loads(deltas), CITY)
    assert events[-1].type == "response.completed"


@pytest.fixture
def hf(gateway_url: str, monkeypatch: pytest.MonkeyPatch) -> InferenceClient:
    # HF_HUB_OFFLINE=1 makes huggingface_hub refuse every URL; this one is our loopback gateway.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return InferenceClient(base_url=gateway_url, api_key="unused", timeout=300)


def test_tgi_grammar_shapes_the_generated_text(hf: InferenceClient) -> None:
    as_json = hf.text_generation(
        "The capital of France as JSON:", max_new_tokens=40, grammar={"type": "json", "value": CITY}
    )
    jsonschema.validate(json.loads(as_json), CITY)
    digits = hf.text_generation("The year Paris hosted the Olympics:", max_new_tokens=8,
                                grammar={"type": "regex", "value": r"\d{4}"})  # fmt: skip
    assert re.fullmatch(r"\d{4}", digits)


def _batch_line(custom_id: str, model: str, **body: Any) -> str:
    request = {"model": model, "temperature": 0, "max_tokens": 60, **body}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": request}
    )


def test_batch_lines_with_response_format_and_a_named_tool_give_matching_bodies(
    client: openai.OpenAI, model: str
) -> None:
    tool = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}
    lines = [
        _batch_line(
            "json", model, messages=[{"role": "user", "content": "The capital of France, as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": CITY}},
        ),
        _batch_line(
            "call", model, messages=[{"role": "user", "content": ASK_WEATHER}], tools=[tool],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        ),
    ]  # fmt: skip
    upload = client.files.create(file=("lines.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + BATCH_TIMEOUT_S
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id is not None
    errors = client.files.content(batch.error_file_id).text if batch.error_file_id else ""
    assert not errors, errors
    output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    bodies = {line["custom_id"]: line["response"]["body"] for line in output}
    assert {line["response"]["status_code"] for line in output} == {200}

    jsonschema.validate(json.loads(bodies["json"]["choices"][0]["message"]["content"]), CITY)
    [call] = bodies["call"]["choices"][0]["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)
