"""A choice's events when its text holds reasoning and tool calls: prepare a chat job, feed its tokens.

The fake byte tokenizer makes every character its own token, so markers always
arrive split across tokens; what a client assembles from the deltas is checked,
and that a takeover's replay resumes the stream exactly where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.protocol import (
    ChatMessage,
    ChatPrompt,
    ChoiceFinished,
    Delta,
    Finished,
    FinishReason,
    FunctionTool,
    GenerationJob,
    JsonConstraint,
    SamplingSpec,
    TokenEvent,
    ToolChoice,
)
from worker.engine import SequenceUpdate
from worker.engine.fake import EOS_TOKEN_ID, ByteTokenizer
from worker.requests.chat_options import ChatOptions
from worker.requests.choices import RequestChoices
from worker.requests.limits import ModelLimits
from worker.requests.params import DefaultLayers
from worker.requests.preparation import PreparedRequest, prepare

TOKENIZER = ByteTokenizer()
LIMITS = ModelLimits(
    max_model_len=4096, eos_token_ids=frozenset({EOS_TOKEN_ID}), vocab_size=257, max_num_beams=1
)
NO_DEFAULTS = DefaultLayers(SamplingSpec(), SamplingSpec())
WEATHER = FunctionTool(name="get_weather", parameters={"type": "object"})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


AUTO = ToolChoice(mode="auto")
PLAIN = ChatOptions()


def prepared(tool_choice: ToolChoice | None = AUTO, chat: ChatOptions = PLAIN, **job: Any) -> PreparedRequest:
    prompt = ChatPrompt(messages=[ChatMessage(role="user", content="Weather in Paris?")], tools=[WEATHER])
    generation = GenerationJob(
        request_id="req-1", model="m", prompt=prompt, created_at=0.0, tool_choice=tool_choice, **job
    )
    return prepare(generation, TOKENIZER, NO_DEFAULTS, LIMITS, chat)


def updates(output: str, finish: FinishReason = FinishReason.STOP) -> list[SequenceUpdate]:
    """One token per update, as the engine steps; a STOP ends with the EOS token."""
    ids = TOKENIZER.encode(output, add_special_tokens=False) + (
        [EOS_TOKEN_ID] if finish is FinishReason.STOP else []
    )
    return [
        SequenceUpdate("req-1", (token,), finish if i == len(ids) - 1 else None)
        for i, token in enumerate(ids)
    ]


def run(request: PreparedRequest, steps: Sequence[SequenceUpdate]) -> list[TokenEvent]:
    choices = RequestChoices.start(
        TOKENIZER, request.engine_requests, request.stop_sequences, request.parsing
    )
    return [event for update in steps for event in choices.consume(0, update)]


@dataclass
class Client:
    """What a streaming client assembles from the deltas."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, events: Sequence[TokenEvent]) -> Client:
        client = cls()
        for delta in (event for event in events if isinstance(event, Delta)):
            client.content += delta.text
            client.reasoning += delta.reasoning
            client.token_ids += delta.token_ids
            for fragment in delta.tool_calls or []:
                call = client.calls.setdefault(fragment.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += fragment.id or ""
                call["name"] += fragment.name or ""
                call["arguments"] += fragment.arguments
        return client

    def call_values(self) -> list[tuple[str, Any]]:
        return [(c["name"], json.loads(c["arguments"])) for _, c in sorted(self.calls.items())]


def finish_reasons(events: Sequence[TokenEvent]) -> tuple[FinishReason, FinishReason]:
    choice = next(e for e in events if isinstance(e, ChoiceFinished))
    final = next(e for e in events if isinstance(e, Finished))
    return choice.finish_reason, final.finish_reason


def test_a_call_in_the_output_becomes_a_tool_call_and_the_choice_finishes_with_tool_calls() -> None:
    output = "Let me check.\n" + CALL

    events = run(prepared(), updates(output))

    client = Client.of(events)
    assert client.content == "Let me check.\n"
    assert client.call_values() == [("get_weather", {"city": "Paris"})]
    assert client.calls[0]["id"].startswith("call_")
    assert finish_reasons(events) == (FinishReason.TOOL_CALLS, FinishReason.TOOL_CALLS)
    # Every token of the text rides on some delta (resume counts on it), the call's included.
    assert client.token_ids == TOKENIZER.encode(output, add_special_tokens=False)


def test_the_call_marker_never_reaches_the_content_even_split_over_tokens() -> None:
    events = run(prepared(), updates(CALL))

    assert all("<" not in e.text for e in events if isinstance(e, Delta))
    assert Client.of(events).content == ""


def test_without_tools_or_with_tool_choice_none_the_text_stays_content() -> None:
    for choice in (None, ToolChoice(mode="none")):
        events = run(prepared(choice), updates(CALL))
        assert (Client.of(events).content, Client.of(events).calls) == (CALL, {})
        assert finish_reasons(events) == (FinishReason.STOP, FinishReason.STOP)


def test_a_call_cut_by_max_tokens_stays_content_and_finishes_with_length() -> None:
    cut = CALL[:30]

    events = run(prepared(), updates(cut, FinishReason.LENGTH))

    assert (Client.of(events).content, Client.of(events).calls) == (cut, {})
    assert finish_reasons(events) == (FinishReason.LENGTH, FinishReason.LENGTH)


def test_a_stop_sequence_is_still_trimmed_before_parsing() -> None:
    request = prepared(sampling=SamplingSpec(stop=["</tool_call>"]))

    events = run(request, updates(CALL + " more text"))

    client = Client.of(events)
    assert (client.content, client.call_values()) == ("", [("get_weather", {"city": "Paris"})])
    finished = next(e for e in events if isinstance(e, ChoiceFinished))
    assert (finished.finish_reason, finished.stop_sequence) == (FinishReason.TOOL_CALLS, "</tool_call>")


def test_reasoning_then_a_call_with_deepseek_r1() -> None:
    request = prepared(chat=ChatOptions(reasoning="deepseek_r1"))

    client = Client.of(run(request, updates("The user wants weather.\n</think>\n\n" + CALL)))

    assert (client.reasoning, client.content) == ("The user wants weather.\n", "")
    assert client.call_values() == [("get_weather", {"city": "Paris"})]


def test_reasoning_with_qwen3_and_no_tools() -> None:
    request = prepared(None, ChatOptions(reasoning="qwen3"))

    client = Client.of(run(request, updates("<think>\nHmm.\n</think>\n\nIt is sunny.")))

    assert (client.reasoning, client.content, client.calls) == ("\nHmm.\n", "It is sunny.", {})


def test_a_constrained_output_keeps_its_reasoning_apart_from_the_json() -> None:
    request = prepared(None, ChatOptions(reasoning="deepseek_r1"), constraint=JsonConstraint())

    client = Client.of(run(request, updates('Think.</think>\n\n{"a": 1}')))

    assert (client.reasoning, client.content) == ("Think.", '{"a": 1}')


def test_a_constrained_output_without_thinking_is_content_with_qwen3() -> None:
    request = prepared(None, ChatOptions(reasoning="qwen3"), constraint=JsonConstraint())

    client = Client.of(run(request, updates('{"a": 1}')))

    assert (client.reasoning, client.content) == ("", '{"a": 1}')


def test_named_tool_choice_streams_the_arguments_as_fragments_of_one_call() -> None:
    request = prepared(ToolChoice(mode="named", name="get_weather"), ChatOptions(reasoning="qwen3"))

    events = run(request, updates('{"city": "Paris"}'))

    fragments = [f for e in events if isinstance(e, Delta) for f in e.tool_calls or []]
    assert len(fragments) > 1 and fragments[0].name == "get_weather" and fragments[0].id
    assert all(f.id is None and f.name is None for f in fragments[1:])
    client = Client.of(events)
    assert (client.content, client.reasoning, client.call_values()) == (
        "",
        "",
        [("get_weather", {"city": "Paris"})],
    )
    assert finish_reasons(events)[0] is FinishReason.TOOL_CALLS


def test_required_tool_choice_gives_calls_and_no_content() -> None:
    output = (
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {}}]'
    )

    client = Client.of(run(prepared(ToolChoice(mode="required")), updates(output)))

    assert client.content == ""
    assert client.call_values() == [("get_weather", {"city": "Paris"}), ("get_weather", {})]


@pytest.mark.parametrize("chat", [ChatOptions(), ChatOptions(reasoning="deepseek_r1")])
def test_a_takeover_replay_resumes_exactly_where_the_published_stream_stopped(chat: ChatOptions) -> None:
    output = "Thinking it over.</think>Sure: " + CALL + "\n" + CALL.replace("Paris", "Rome")
    steps = updates(output)
    whole = run(prepared(chat=chat), steps)
    deltas = [e for e in whole if isinstance(e, Delta)]
    for published in range(1, len(deltas)):
        first_run = deltas[:published]
        seen = Client.of(first_run)
        request = prepared(chat=chat)
        choices = RequestChoices.start(
            TOKENIZER, request.engine_requests, request.stop_sequences, request.parsing
        )
        choices.outputs[0].replay(seen.token_ids, seen.content)
        rest = [e for update in steps[len(seen.token_ids) :] for e in choices.consume(0, update)]

        assert Client.of([*first_run, *rest]) == Client.of(whole), published
        assert finish_reasons(rest) == finish_reasons(whole)
