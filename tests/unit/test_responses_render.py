"""Responses API rendering: events -> output items and stream events, checked against the SDK types."""

from __future__ import annotations

from typing import Any

import openai.types.responses as sdk
from pydantic import TypeAdapter

from gateway.responses_api.render import ResponseStream, finished_response
from gateway.responses_api.schema import ResponseCreateRequest
from gateway.responses_api.translate import pending_response
from shared.errors import InvalidRequest
from shared.protocol import (
    Accepted,
    Delta,
    Failed,
    Finished,
    FinishReason,
    TokenEvent,
    ToolCallDelta,
    Usage,
)

SDK_EVENT = TypeAdapter(sdk.ResponseStreamEvent)
PENDING = pending_response(ResponseCreateRequest.model_validate({"model": "m", "input": "Hi"}), "rid", 1.0)


def finished(reason: FinishReason = FinishReason.STOP, tokens: int = 2) -> Finished:
    return Finished(finish_reason=reason, usage=Usage(prompt_tokens=4, completion_tokens=tokens))


def streamed(events: list[TokenEvent], starting_after: int = -1) -> list[Any]:
    """The stream's events, each parsed by the SDK exactly as a client would."""
    stream = ResponseStream(PENDING, "rid", 2.0, starting_after)
    made = [item for event in events for item in stream.events(event)]
    return [SDK_EVENT.validate_python(item.model_dump(mode="json")) for item in made]


def whole(events: list[TokenEvent]) -> sdk.Response:
    return sdk.Response.model_validate(finished_response(PENDING, events, "rid", 2.0).model_dump(mode="json"))


TEXT = [
    Accepted(prompt_tokens=4, worker_id="w"),
    Delta(text="Hel", token_ids=[1]),
    Delta(text="lo", token_ids=[2]),
    finished(),
]
CALL = [
    Accepted(prompt_tokens=4, worker_id="w"),
    Delta(text="", token_ids=[1], tool_calls=[ToolCallDelta(index=0, id="call_a", name="get_weather")]),
    Delta(text="", token_ids=[2], tool_calls=[ToolCallDelta(index=0, arguments='{"city": ')]),
    Delta(text="", token_ids=[3], tool_calls=[ToolCallDelta(index=0, arguments='"Paris"}')]),
    finished(FinishReason.TOOL_CALLS, 3),
]
THOUGHT = [
    Accepted(prompt_tokens=4, worker_id="w"),
    Delta(text="", reasoning="Think", token_ids=[1]),
    Delta(text="", reasoning="ing.", token_ids=[2]),
    Delta(text="Paris.", token_ids=[3]),
    finished(tokens=3),
]


def test_text_folds_into_a_completed_response_with_usage() -> None:
    done = whole(TEXT)
    assert (done.status, done.id, done.completed_at, done.output_text) == (
        "completed",
        "resp_rid",
        2.0,
        "Hello",
    )
    assert done.output[0].id == "msg_rid"
    assert done.usage is not None and (done.usage.input_tokens, done.usage.output_tokens) == (4, 2)


def test_length_finish_is_incomplete_and_failure_is_failed() -> None:
    incomplete = whole([*TEXT[:3], finished(FinishReason.LENGTH)])
    assert incomplete.status == "incomplete" and incomplete.incomplete_details is not None
    assert incomplete.output[0].status == "incomplete"
    failed = finished_response(PENDING, [Failed(error=InvalidRequest("bad").to_info())], "rid", 2.0)
    assert failed.status == "failed" and failed.error is not None and failed.error.message == "bad"


def test_text_streams_in_openai_order() -> None:
    events = streamed(TEXT)
    assert [event.type for event in events] == [
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
    assert [event.sequence_number for event in events] == list(range(10))
    assert events[-1].response.output_text == "Hello"


def test_tool_calls_fold_into_function_call_items() -> None:
    done = whole(CALL)
    assert done.status == "completed" and done.output_text == ""
    assert [item.model_dump(exclude_none=True) for item in done.output] == [
        {
            "id": "fc_rid_0",
            "type": "function_call",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        }
    ]


def test_a_function_call_streams_its_arguments_in_fragments() -> None:
    events = streamed(CALL)
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = events[2].item, events[6].item
    assert (added.type, added.call_id, added.name, added.arguments, added.status) == (
        "function_call", "call_a", "get_weather", "", "in_progress",
    )  # fmt: skip
    assert [event.delta for event in events[3:5]] == ['{"city": ', '"Paris"}']
    assert {event.item_id for event in events[3:7] if hasattr(event, "item_id")} == {"fc_rid_0"}
    assert events[5].arguments == done.arguments == '{"city": "Paris"}' and done.status == "completed"
    assert events[-1].response.output == [done]


def test_parallel_calls_are_one_item_each_in_order() -> None:
    two = [
        Accepted(prompt_tokens=4, worker_id="w"),
        Delta(text="", token_ids=[1], tool_calls=[ToolCallDelta(index=0, id="c0", name="f", arguments="{}")]),
        Delta(text="", token_ids=[2], tool_calls=[ToolCallDelta(index=1, name="g", arguments="{}")]),
        finished(FinishReason.TOOL_CALLS),
    ]
    output = whole(two).output
    assert [(item.type, item.call_id, item.name) for item in output] == [  # type: ignore[union-attr]
        ("function_call", "c0", "f"),
        ("function_call", "call_rid_1", "g"),  # a call the worker gave no id gets one
    ]
    kinds = [(event.type, getattr(event, "output_index", None)) for event in streamed(two)]
    assert ("response.output_item.done", 0) in kinds and kinds.index(
        ("response.output_item.done", 0)
    ) < kinds.index(("response.output_item.added", 1))


def test_reasoning_comes_first_as_a_reasoning_item_then_the_message() -> None:
    done = whole(THOUGHT)
    reasoning, message = done.output
    assert reasoning.type == "reasoning" and reasoning.id == "rs_rid" and reasoning.summary == []
    assert [(part.type, part.text) for part in reasoning.content or []] == [("reasoning_text", "Thinking.")]
    assert message.type == "message" and done.output_text == "Paris."


def test_reasoning_streams_as_reasoning_text_then_the_answer_streams() -> None:
    events = streamed(THOUGHT)
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[3].part.type == "reasoning_text" and events[6].text == "Thinking."
    assert (events[2].output_index, events[9].output_index) == (0, 1)
    assert events[-1].response.model_dump() == whole(THOUGHT).model_dump()


def test_a_stream_picked_up_again_continues_after_the_number_given() -> None:
    full = streamed(THOUGHT)
    assert streamed(THOUGHT, starting_after=8) == full[9:]


def test_a_response_that_produced_nothing_still_answers_an_empty_message() -> None:
    events = streamed([Accepted(prompt_tokens=4, worker_id="w"), finished(tokens=1)])
    assert [event.type for event in events][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-1].response.output[0].content[0].text == ""
