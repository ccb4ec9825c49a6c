"""Owns the OpenAI objects we answer with: chat completions, text completions, their chunks, models.

Field order follows OpenAI's, so serialized objects read like theirs. Keys OpenAI
leaves out when they carry nothing (a delta's unchanged parts, a message's absent
tool calls or reasoning) are ``MISSING`` rather than null. Tool calls' shapes are
``gateway/openai/tool_objects.py``'s.
"""

from __future__ import annotations

from typing import Literal

from pydantic import MISSING, BaseModel, Field

from gateway.openai.tool_objects import FunctionCallChunk, FunctionCallObject, ToolCallChunk, ToolCallObject

# ``function_call`` answers a request that used the deprecated ``functions``.
FinishReasonName = Literal["stop", "length", "tool_calls", "function_call"]


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = Field(description="Of the completion tokens, those of the model's thinking.")


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="Of the prompt tokens, those the engine's prefix cache served.")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Sent only when the model thought (a worker with a reasoning parser): earlier shapes stay as they were.
    completion_tokens_details: CompletionTokensDetails | MISSING = MISSING
    # Sent only when the engine reports prefix-cache hits (vLLM's) and there were some.
    prompt_tokens_details: PromptTokensDetails | MISSING = MISSING


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = Field(description="The token's UTF-8 bytes.")


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = Field(description="The token's UTF-8 bytes.")
    top_logprobs: list[TopLogprob] = Field(description="The most likely tokens at this position.")


class ChoiceLogprobs(BaseModel):
    """Chat logprobs: one entry per generated token."""

    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class CompletionChoiceLogprobs(BaseModel):
    """Legacy completions logprobs: parallel lists, one entry per token (prompt tokens first with echo)."""

    text_offset: list[int] = Field(description="Where each token's text starts in the choice's text.")
    token_logprobs: list[float | None] = Field(description="Null for the prompt's first token.")
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None] = Field(description="Most likely tokens at each position.")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="The answer's text; null when the message only calls tools.")
    # The model's thinking, split off by the worker's reasoning parser: vLLM's two names for it.
    reasoning_content: str | MISSING = MISSING
    reasoning: str | MISSING = MISSING
    tool_calls: list[ToolCallObject] | MISSING = MISSING
    function_call: FunctionCallObject | MISSING = MISSING


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReasonName


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    # MISSING, unlike None, leaves the key out: OpenAI's deltas carry only what changed.
    role: Literal["assistant"] | MISSING = MISSING
    content: str | MISSING = MISSING
    reasoning_content: str | MISSING = MISSING
    reasoning: str | MISSING = MISSING
    tool_calls: list[ToolCallChunk] | MISSING = MISSING
    function_call: FunctionCallChunk | MISSING = MISSING


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReasonName | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    # Present (null on all but the last) only when the client asked for include_usage.
    usage: Usage | MISSING | None = MISSING


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: CompletionChoiceLogprobs | None = None
    finish_reason: FinishReasonName | None = None


class Completion(BaseModel):
    """A text_completion object; also each chunk of a streamed completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | MISSING | None = MISSING


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenferry"
    max_model_len: int = Field(description="Context window of the workers serving it, in tokens.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
