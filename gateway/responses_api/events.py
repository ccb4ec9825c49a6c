"""Owns the Responses API's stream event shapes; each carries its ``sequence_number``.

Names and fields follow the official SDK's ``ResponseStreamEvent`` union. A
reasoning item streams like a message: its one ``reasoning_text`` part is opened
with ``response.content_part.added`` (the SDK's ``PartReasoningText``) and grows
by ``response.reasoning_text.delta``; a function call grows by
``response.function_call_arguments.delta``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from gateway.responses_api.objects import OutputItem, OutputText, ReasoningText, Response


class ResponseLifecycleEvent(BaseModel):
    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete"]
    sequence_number: int
    response: Response


class OutputItemEvent(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int = 0
    item: OutputItem


class ContentPartEvent(BaseModel):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    part: OutputText | ReasoningText


class TextDeltaEvent(BaseModel):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str
    logprobs: list[Any] = []


class TextDoneEvent(BaseModel):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    text: str
    logprobs: list[Any] = []


class ReasoningDeltaEvent(BaseModel):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str


class ReasoningDoneEvent(BaseModel):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    text: str


class ArgumentsDeltaEvent(BaseModel):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    sequence_number: int
    item_id: str
    output_index: int = 0
    delta: str


class ArgumentsDoneEvent(BaseModel):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int = 0
    name: str
    arguments: str
