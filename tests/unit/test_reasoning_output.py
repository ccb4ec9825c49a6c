"""A constrained reasoning model's output: thinking as reasoning, the JSON as content, tokens counted.

Jobs are prepared with the fake byte tokenizer (one token per character) and their
tokens fed one update at a time, as the engine steps; the events are then rendered as
a client of each API would see them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import openai.types.responses as sdk

from gateway.openai import render, translate
from gateway.openai.schema import ChatCompletionRequest
from gateway.responses_api.render import finished_response
from gateway.responses_api.schema import ResponseCreateRequest
from gateway.responses_api.translate import pending_response
from shared.protocol import (
    Accepted,
    ChatMessage,
    ChatPrompt,
    ChoiceFinished,
    Delta,
    Finished,
    FinishReason,
    GenerationJob,
    JsonConstraint,
    Prompt,
    SamplingSpec,
    TextPrompt,
    TokenEvent,
    Usage,
)
from worker.engine import SequenceUpdate
from worker.engine.fake import EOS_TOKEN_ID, ByteTokenizer
from worker.requests.chat_options import ChatOptions
from worker.requests.choices import RequestChoices
from worker.requests.limits import ModelLimits
from worker.requests.params import DefaultLayers
from worker.requests.preparation import PreparedRequest, prepare
from worker.requests.reasoning import ReasoningParserName

TOKENIZER = ByteTokenizer()
LIMITS = ModelLimits(
    max_model_len=4096, eos_token_ids=frozenset({EOS_TOKEN_ID}), vocab_size=257, max_num_beams=1
)
NO_DEFAULTS = DefaultLayers(SamplingSpec(), SamplingSpec())
CHAT = ChatPrompt(messages=[ChatMessage(role="user", content="Is it sunny?")])
ANSWER = '{"sunny": true}'


def prepared(reasoning: ReasoningParserName, prompt: Prompt = CHAT) -> PreparedRequest:
    job = GenerationJob(
        request_id="req-1", model="m", prompt=prompt, created_at=0.0, constraint=JsonConstraint()
    )
    return prepare(job, TOKENIZER, NO_DEFAULTS, LIMITS, ChatOptions(reasoning=reasoning))


def updates(output: str, finish: FinishReason = FinishReason.STOP) -> list[SequenceUpdate]:
    """One token per update; a STOP ends with the EOS token."""
    ids = TOKENIZER.encode(output, add_special_tokens=False)
    ids += [EOS_TOKEN_ID] if finish is FinishReason.STOP else []
    last = len(ids) - 1
    return [SequenceUpdate("req-1", (token,), finish if i == last else None) for i, token in enumerate(ids)]


def run(request: PreparedRequest, steps: Sequence[SequenceUpdate]) -> list[TokenEvent]:
    choices = RequestChoices.start(
        TOKENIZER, request.engine_requests, request.stop_sequences, request.parsing
    )
    events: list[TokenEvent] = [Accepted(prompt_tokens=4, worker_id="w")]
    return events + [event for update in steps for event in choices.consume(0, update)]


def streamed(events: Sequence[TokenEvent]) -> tuple[str, str]:
    """The reasoning and the content a streaming client assembles."""
    deltas = [event for event in events if isinstance(event, Delta)]
    return "".join(d.reasoning for d in deltas), "".join(d.text for d in deltas)


def finished(events: Sequence[TokenEvent]) -> Finished:
    return next(event for event in events if isinstance(event, Finished))


def chat_completion(events: Sequence[TokenEvent]) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    meta = translate.chat_meta(ChatCompletionRequest.model_validate(body), "rid", 1)
    return render.chat_completion(meta, events).model_dump(mode="json")


def test_deepseek_r1_thinking_is_reasoning_and_the_json_is_content() -> None:
    events = run(prepared("deepseek_r1"), updates("Warm out.</think>\n\n" + ANSWER))

    assert streamed(events) == ("Warm out.", ANSWER)
    body = chat_completion(events)
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": ANSWER,
        "reasoning_content": "Warm out.",
        "reasoning": "Warm out.",
    }
    assert json.loads(body["choices"][0]["message"]["content"]) == {"sunny": True}
    prompt, completion = finished(events).usage.prompt_tokens, len("Warm out.</think>\n\n" + ANSWER) + 1
    assert body["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,  # the EOS token's included
        "total_tokens": prompt + completion,
        "completion_tokens_details": {"reasoning_tokens": len("Warm out.</think>")},
    }


def test_qwen3_json_without_thinking_is_all_content_and_counts_no_reasoning() -> None:
    events = run(prepared("qwen3"), updates(ANSWER))

    assert streamed(events) == ("", ANSWER)
    assert finished(events).usage.reasoning_tokens == 0
    assert "completion_tokens_details" not in chat_completion(events)["usage"]


def test_qwen3_thinking_opened_by_the_output_is_reasoning() -> None:
    events = run(prepared("qwen3"), updates("<think>Warm.</think>\n\n" + ANSWER))

    assert streamed(events) == ("Warm.", ANSWER)
    assert finished(events).usage.reasoning_tokens == len("<think>Warm.</think>")


def test_a_prompt_that_closed_the_thinking_is_answered_all_in_content() -> None:
    for reasoning in ("deepseek_r1", "qwen3"):
        request = prepared(reasoning, TextPrompt(text="Is it sunny?<think>\n\n</think>\n\n"))
        assert request.engine_request.thinking is None  # the grammar holds from the first token

        events = run(request, updates(ANSWER))

        assert streamed(events) == ("", ANSWER)


def test_the_grammar_waits_for_the_thinking_only_with_a_reasoning_parser() -> None:
    assert prepared("deepseek_r1").engine_request.grammar is None  # the fake engine compiles none
    assert prepared("none").parsing.reasoning == "none"
    assert prepared("deepseek_r1").parsing.reasoning == "deepseek_r1"


def test_a_cut_while_thinking_is_length_with_no_content_and_all_reasoning() -> None:
    events = run(prepared("deepseek_r1"), updates("Still thinking", FinishReason.LENGTH))

    assert streamed(events) == ("Still thinking", "")
    choice = next(event for event in events if isinstance(event, ChoiceFinished))
    assert (choice.finish_reason, choice.reasoning_tokens, choice.completion_tokens) == (
        FinishReason.LENGTH,
        len("Still thinking"),
        len("Still thinking"),
    )
    assert chat_completion(events)["choices"][0]["message"]["content"] == ""


def test_a_takeover_mid_thinking_counts_the_replayed_reasoning() -> None:
    request = prepared("deepseek_r1")
    output = "Warm out.</think>\n\n" + ANSWER
    choices = RequestChoices.start(TOKENIZER, request.engine_requests, (), request.parsing)
    choices.outputs[0].replay(TOKENIZER.encode(output[:5], add_special_tokens=False), "")

    events = [event for update in updates(output)[5:] for event in choices.consume(0, update)]

    assert streamed(events) == ("out.", ANSWER)  # "Warm " went out before the takeover
    assert finished(events).usage.reasoning_tokens == len("Warm out.</think>")


def test_reasoning_tokens_reach_the_responses_api_usage() -> None:
    pending = pending_response(
        ResponseCreateRequest.model_validate({"model": "m", "input": "Hi"}), "rid", 1.0
    )
    usage = Usage(prompt_tokens=4, completion_tokens=9, reasoning_tokens=6)
    events: list[TokenEvent] = [
        Accepted(prompt_tokens=4, worker_id="w"),
        Delta(text="", reasoning="Warm.", token_ids=[1]),
        Delta(text=ANSWER, token_ids=[2]),
        Finished(finish_reason=FinishReason.STOP, usage=usage),
    ]

    response = sdk.Response.model_validate(
        finished_response(pending, events, "rid", 2.0).model_dump(mode="json")
    )

    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 6


def test_streamed_chat_usage_sums_the_reasoning_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    meta = translate.chat_meta(
        ChatCompletionRequest.model_validate({**body, "stream_options": {"include_usage": True}}), "rid", 1
    )
    stream = render.ChatStream(meta)
    usage = Usage(prompt_tokens=4, completion_tokens=9, reasoning_tokens=6)
    ended: list[TokenEvent] = [
        ChoiceFinished(index=0, finish_reason=FinishReason.STOP, completion_tokens=9, reasoning_tokens=6),
        Finished(finish_reason=FinishReason.STOP, usage=usage),
    ]
    chunks = [chunk for event in ended for chunk in stream.chunks(event)]

    last = chunks[-1].model_dump(mode="json")
    assert last["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}
