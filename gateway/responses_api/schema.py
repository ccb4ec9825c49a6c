"""Owns the OpenAI Responses API shapes this gateway speaks: the request, the response, its stream events.

Only text in and text out: ``input`` is a string or a list of messages (text
content), the output is one assistant message with one ``output_text`` part.
Field names follow the official SDK's types (``openai/types/responses/``);
tools, reasoning and conversations are not supported and refused when asked.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.openai.limits import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOKEN_COUNT, as_list

ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "incomplete", "cancelled"]
TERMINAL_RESPONSE_STATUSES: frozenset[str] = frozenset({"completed", "failed", "incomplete", "cancelled"})
# OpenAI's bounds on metadata: 16 pairs, keys up to 64 characters, values up to 512.
MAX_METADATA_PAIRS = 16
_MetadataKey = Annotated[str, Field(max_length=64)]
_MetadataValue = Annotated[str, Field(max_length=512)]


def _text_part(text: str) -> dict[str, str]:
    return {"type": "input_text", "text": text}


def _user_message(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


class InputText(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text", "text"]
    text: str


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    # A string is read as one text part, so a bad part is reported at its own place.
    content: Annotated[
        list[InputText],
        as_list(InputText, MAX_CONTENT_PARTS, "content parts", _text_part),
    ]


class ResponseCreateRequest(BaseModel):
    # inf and nan parse from JSON (1e999, NaN) but are no sampling parameter's value.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str = Field(description="A model a worker serves.")
    # A string is read as one user message, so a bad message is reported at its own place.
    input: Annotated[
        list[InputMessage],
        as_list(InputMessage, MAX_MESSAGES, "messages", _user_message),
        Field(description="Text, or a list of messages."),
    ]
    instructions: str | None = Field(None, description="A system message put before the input.")
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKEN_COUNT)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool | None = None
    background: bool | None = Field(
        None, description="Answer at once (status queued) and run on; poll by id."
    )
    metadata: dict[_MetadataKey, _MetadataValue] | None = Field(None, max_length=MAX_METADATA_PAIRS)
    store: bool | None = None
    tools: list[dict[str, Any]] | None = None
    previous_response_id: str | None = None


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


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
    output: list[OutputMessage] = []
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    usage: ResponseUsage | None = None
    parallel_tool_calls: bool = False
    tool_choice: Literal["none", "auto"] = "none"
    tools: list[Any] = []


# Stream events (each carries its sequence_number)


class ResponseLifecycleEvent(BaseModel):
    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete"]
    sequence_number: int
    response: Response


class OutputItemEvent(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int = 0
    item: OutputMessage


class ContentPartEvent(BaseModel):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    part: OutputText


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
