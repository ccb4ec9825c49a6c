"""Responses API translation: request -> job, events -> response and stream events."""

from __future__ import annotations

import pytest

from gateway.responses_api.schema import ResponseCreateRequest
from gateway.responses_api.translate import ResponseStream, finished_response, pending_response, response_job
from shared.errors import InvalidRequest
from shared.protocol import Accepted, ChatMessage, Delta, Failed, Finished, FinishReason, Usage


def request(**fields: object) -> ResponseCreateRequest:
    return ResponseCreateRequest.model_validate({"model": "m", "input": "Hi", **fields})


def test_instructions_become_a_system_message_before_the_input() -> None:
    job = response_job(request(instructions="Be brief.", max_output_tokens=7, temperature=0.5), "rid", 1.0)
    assert job.prompt.messages == [  # type: ignore[union-attr]
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Hi"),
    ]
    assert (job.sampling.max_tokens, job.sampling.temperature) == (7, 0.5)


def test_message_list_input_joins_text_parts() -> None:
    messages = [
        {"role": "developer", "content": "Rules"},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
    ]
    job = response_job(request(input=messages), "rid", 1.0)
    assert job.prompt.messages == [
        ChatMessage(role="system", content="Rules"),
        ChatMessage(role="user", content="a\nb"),
    ]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "fields", [{"tools": [{"type": "web_search"}]}, {"previous_response_id": "resp_earlier"}]
)
def test_unsupported_fields_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        response_job(request(**fields), "rid", 1.0)


EVENTS = [
    Accepted(prompt_tokens=4, worker_id="w"),
    Delta(text="Hel", token_ids=[1]),
    Delta(text="lo", token_ids=[2]),
    Finished(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=4, completion_tokens=2)),
]


def test_events_fold_into_a_completed_response_with_usage() -> None:
    done = finished_response(pending_response(request(), "rid", 1.0), EVENTS, "rid", 2.0)
    assert done.status == "completed" and done.id == "resp_rid" and done.completed_at == 2.0
    assert done.output[0].content[0].text == "Hello" and done.output[0].id == "msg_rid"
    assert done.usage is not None and (done.usage.input_tokens, done.usage.output_tokens) == (4, 2)


def test_length_finish_is_incomplete_and_failure_is_failed() -> None:
    cut = Finished(finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=4, completion_tokens=2))
    incomplete = finished_response(pending_response(request(), "rid", 1.0), [*EVENTS[:3], cut], "rid", 2.0)
    assert incomplete.status == "incomplete" and incomplete.incomplete_details is not None
    failure = Failed(error=InvalidRequest("bad").to_info())
    failed = finished_response(pending_response(request(), "rid", 1.0), [failure], "rid", 2.0)
    assert failed.status == "failed" and failed.error is not None and failed.error.message == "bad"


def test_stream_events_are_numbered_and_typed_in_openai_order() -> None:
    stream = ResponseStream(pending_response(request(), "rid", 1.0), "rid", 2.0)
    events = [item for event in EVENTS for item in stream.events(event)]
    assert [item.type for item in events] == [  # type: ignore[attr-defined]
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [item.sequence_number for item in events] == list(range(10))  # type: ignore[attr-defined]
    assert events[-1].response.output[0].content[0].text == "Hello"  # type: ignore[attr-defined]
