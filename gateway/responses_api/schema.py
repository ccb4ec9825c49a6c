"""Owns the request shape of the OpenAI Responses API this gateway speaks.

``input`` is a string (one user message) or a list of items: messages (text
content), ``function_call`` items (calls the model made earlier, replayed),
``function_call_output`` items (what those calls returned) and ``reasoning``
items (accepted so a client can send a response's output back as it came, and
left out of the prompt: chat templates drop earlier turns' thinking too).
``tools`` are function tools in the Responses' flat shape; ``text.format`` asks
for JSON (any object, or a schema). The answer's shapes are
``gateway/responses_api/objects.py``'s. Field names follow the official SDK's types.

Fields OpenAI defines that we cannot honour (built-in tools, ``include``,
``reasoning.effort``, stored prompts, conversations, ``truncation: auto``...) are
refused with a 400 naming them, never silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from gateway.openai.fields import refuse_when
from gateway.openai.limits import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOKEN_COUNT, as_list

# OpenAI's bounds on metadata: 16 pairs, keys up to 64 characters, values up to 512.
MAX_METADATA_PAIRS = 16
_MetadataKey = Annotated[str, Field(max_length=64)]
_MetadataValue = Annotated[str, Field(max_length=512)]


def _text_part(text: str) -> dict[str, str]:
    return {"type": "input_text", "text": text}


def _user_message(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class InputText(_Body):
    # reasoning_text: the content of a reasoning item sent back.
    type: Literal["input_text", "output_text", "text", "reasoning_text"]
    text: str


_Parts = Annotated[list[InputText], as_list(InputText, MAX_CONTENT_PARTS, "content parts", _text_part)]
# What each kind of item needs besides its type.
_NEEDS: dict[str, tuple[str, ...]] = {
    "message": ("role", "content"),
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
    "reasoning": (),
}


class InputItem(_Body):
    """One input item: a message, an earlier ``function_call``, a ``function_call_output``, or a
    ``reasoning`` item (dropped from the prompt).

    One flat model rather than a union of four, so a problem is reported at its own place
    (``input.2.content``) rather than under a union branch's name.
    """

    # Messages may leave out their type (EasyInputMessage).
    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    # A string is read as one text part, so a bad part is reported at its own place.
    content: _Parts | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = Field(None, description="A function_call's arguments, as JSON text.")
    output: _Parts | None = Field(None, description="What a function returned for the call call_id.")

    @model_validator(mode="after")
    def _has_its_fields(self) -> InputItem:
        missing = [name for name in _NEEDS[self.type] if getattr(self, name) is None]
        if missing:
            raise PydanticCustomError(
                "missing",
                "A {kind} item needs {fields}.",
                {"kind": self.type, "fields": ", ".join(missing)},
            )
        return self


class ToolParam(_Body):
    """A tool; only ``function`` tools are served (``gateway/responses_api/translate.py`` refuses others)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceParam(_Body):
    """``{"type": "function", "name": ...}``; other kinds (built-in tools, allowed_tools) are refused."""

    type: str
    name: str | None = None


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


def _is_set(value: Any) -> bool:
    return value is not None


def _is_truthy(value: Any) -> bool:
    return bool(value)


def _is_auto(value: Any) -> bool:
    return bool(value == "auto")


def _is_a_paid_tier(value: Any) -> bool:
    return value not in (None, "auto", "default")


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Annotated[
        str | None, refuse_when(_is_set, "text.verbosity is not supported by this server.")
    ] = None


class ReasoningConfig(_Body):
    effort: Annotated[
        str | None,
        refuse_when(_is_set, "reasoning.effort is not supported: a model here thinks as its template says."),
    ] = None
    summary: Annotated[
        str | None,
        refuse_when(_is_set, "reasoning.summary is not supported: reasoning comes back as reasoning_text."),
    ] = None
    generate_summary: Annotated[
        str | None, refuse_when(_is_set, "reasoning.generate_summary is not supported.")
    ] = None


def _not_supported(name: str) -> str:
    return f"{name} is not supported by this server."


class ResponseCreateRequest(_Body):
    # inf and nan parse from JSON (1e999, NaN) but are no sampling parameter's value.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str = Field(description="A model a worker serves.")
    # A string is read as one user message, so a bad item is reported at its own place.
    input: Annotated[
        list[InputItem],
        as_list(InputItem, MAX_MESSAGES, "input items", _user_message),
        Field(description="Text, or a list of messages, function calls and their outputs."),
    ]
    instructions: str | None = Field(
        None, description="A system message put before the input; not carried to a continuation."
    )
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKEN_COUNT)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool | None = None
    background: bool | None = Field(
        None, description="Answer at once (status queued) and run on; poll by id."
    )
    metadata: dict[_MetadataKey, _MetadataValue] | None = Field(None, max_length=MAX_METADATA_PAIRS)
    store: bool | None = Field(
        None, description="Keep the response (default), so it can be retrieved and continued."
    )
    tools: list[ToolParam] | None = Field(None, description="Function tools the model may call.")
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceParam | None = None
    parallel_tool_calls: bool | None = Field(None, description="Allow several calls in one turn (default).")
    text: TextConfig | None = Field(None, description='{"format": ...}: text, json_object or json_schema.')
    reasoning: ReasoningConfig | None = None
    previous_response_id: str | None = Field(
        None, description="Continue a stored response: its input and output come before this input."
    )
    include: Annotated[list[Any] | None, refuse_when(_is_truthy, _not_supported("include"))] = None
    conversation: Annotated[Any, refuse_when(_is_set, _not_supported("conversation"))] = None
    prompt: Annotated[Any, refuse_when(_is_set, _not_supported("prompt (stored prompts)"))] = None
    truncation: Annotated[
        str | None, refuse_when(_is_auto, "truncation 'auto' is not supported; the input is never cut.")
    ] = None
    top_logprobs: Annotated[int | None, refuse_when(_is_truthy, _not_supported("top_logprobs"))] = None
    max_tool_calls: Annotated[int | None, refuse_when(_is_set, _not_supported("max_tool_calls"))] = None
    service_tier: Annotated[
        str | None, refuse_when(_is_a_paid_tier, "service_tier: only 'auto' and 'default' are served.")
    ] = None
