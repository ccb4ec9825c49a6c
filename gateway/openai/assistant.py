"""Owns the assistant's side of a chat answer: its message from a choice's parts, and each part as a delta.

The worker splits its output into content (``Delta.text``), reasoning
(``Delta.reasoning``) and tool-call fragments (``Delta.tool_calls``); this module
gives each its OpenAI key. Reasoning goes out under both names vLLM has used,
``reasoning_content`` and ``reasoning``, since clients read one or the other. A
message that only calls tools has ``content: null``, as OpenAI's do. A request that
used the deprecated ``functions`` gets the deprecated shape: ``function_call`` (one
call: its tool choice allowed no more) and the finish reason ``function_call``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.openai.objects import AssistantMessage, ChatDelta, FinishReasonName
from gateway.openai.tool_objects import FunctionCallChunk, FunctionCallObject, ToolCallChunk, ToolCallObject
from shared.protocol import Delta, ToolCallDelta


@dataclass
class CallFold:
    """One tool call put together from its fragments."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def add(self, fragment: ToolCallDelta) -> None:
        self.id = self.id or fragment.id
        self.name = self.name or fragment.name or ""
        self.arguments.append(fragment.arguments)


def fold_calls(calls: dict[int, CallFold], fragments: list[ToolCallDelta] | None) -> None:
    """Add a delta's fragments to the calls they belong to (by index)."""
    for fragment in fragments or []:
        calls.setdefault(fragment.index, CallFold()).add(fragment)


def assistant_message(
    text: str, reasoning: str, calls: dict[int, CallFold], legacy: bool
) -> AssistantMessage:
    """The whole message of one choice."""
    parts: dict[str, Any] = {"content": text if text or not calls else None}
    if reasoning:
        parts |= {"reasoning_content": reasoning, "reasoning": reasoning}
    objects = [_call_object(index, calls[index]) for index in sorted(calls)]
    if objects and legacy:
        parts["function_call"] = objects[0].function
    elif objects:
        parts["tool_calls"] = objects
    return AssistantMessage(**parts)


def _call_object(index: int, call: CallFold) -> ToolCallObject:
    # The worker names each call on its first fragment; an id is made up only if it did not.
    function = FunctionCallObject(name=call.name, arguments="".join(call.arguments))
    return ToolCallObject(id=call.id or f"call_{index}", function=function)


def has_parts(delta: Delta) -> bool:
    """Whether a delta carries anything a chunk shows."""
    return bool(delta.text or delta.reasoning or delta.tool_calls or delta.logprobs)


def chat_delta(delta: Delta, legacy: bool) -> ChatDelta:
    """A delta's parts under OpenAI's keys; only the parts it carries."""
    parts: dict[str, Any] = {}
    if delta.text or not (delta.reasoning or delta.tool_calls):
        parts["content"] = delta.text
    if delta.reasoning:
        parts |= {"reasoning_content": delta.reasoning, "reasoning": delta.reasoning}
    fragments = delta.tool_calls or []
    if legacy:
        first = [_function_chunk(fragment) for fragment in fragments if fragment.index == 0]
        if first:
            parts["function_call"] = first[0]
    elif fragments:
        parts["tool_calls"] = [_call_chunk(fragment) for fragment in fragments]
    return ChatDelta(**parts)


def _call_chunk(fragment: ToolCallDelta) -> ToolCallChunk:
    function = _function_chunk(fragment)
    if fragment.id is None:
        return ToolCallChunk(index=fragment.index, function=function)
    return ToolCallChunk(index=fragment.index, id=fragment.id, type="function", function=function)


def _function_chunk(fragment: ToolCallDelta) -> FunctionCallChunk:
    if fragment.name is None:
        return FunctionCallChunk(arguments=fragment.arguments)
    return FunctionCallChunk(name=fragment.name, arguments=fragment.arguments)


def finish_reason(reason: FinishReasonName, legacy: bool) -> FinishReasonName:
    """The deprecated functions API ends a calling choice with ``function_call``."""
    return "function_call" if legacy and reason == "tool_calls" else reason
