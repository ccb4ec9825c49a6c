"""Owns the Responses API's answer shapes: the response object and its output items.

Field names follow the official SDK's types (``openai/types/responses/``). The
output is a list of items, in the order the model produced them: a ``reasoning``
item (the thinking the worker's reasoning parser split off, as ``reasoning_text``
content, with an empty ``summary``: vLLM's shape, since no model here writes
summaries), ``message`` items (the answer's text) and ``function_call`` items (one
per tool call, its ``arguments`` JSON text as generated).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "incomplete", "cancelled"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]
TERMINAL_RESPONSE_STATUSES: frozenset[str] = frozenset({"completed", "failed", "incomplete", "cancelled"})
# A stored response another may continue (``previous_response_id``): one that produced its output.
CONTINUABLE_STATUSES: frozenset[str] = frozenset({"completed", "incomplete"})


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class ReasoningItem(BaseModel):
    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = []
    content: list[ReasoningText]
    status: ItemStatus


OutputItem = Annotated[OutputMessage | FunctionCallItem | ReasoningItem, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: float
    completed_at: float | None = None
    status: ResponseStatus
    background: bool = False
    model: str
    output: list[OutputItem] = []
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    usage: ResponseUsage | None = None
    parallel_tool_calls: bool = True
    # "none" | "auto" | "required" | {"type": "function", "name": ...}, as the request gave it.
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = []
    # {"format": {...}}: the request's output format, echoed.
    text: dict[str, Any] = {"format": {"type": "text"}}
    previous_response_id: str | None = None
    store: bool = True
