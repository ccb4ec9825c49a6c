"""Owns the public OpenAI HTTP schema: request and response models of the endpoints we serve.

Requests ignore fields they do not know (clients send many we have no use for),
document themselves through ``Field(description=...)`` and keep OpenAI's field
order, then our HuggingFace extras. Their field types, bounds and refusals live
in ``gateway/openai/fields.py``. These models never leave the gateway: translation
to the job protocol is ``gateway/openai/translate.py``'s business.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import MISSING, AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from gateway.openai.fields import (
    BestOf,
    ChatLogprobs,
    ChoiceCount,
    CompletionLogprobs,
    FunctionCall,
    Functions,
    IgnoreEos,
    LengthPenalty,
    LogitBias,
    MaxTokens,
    MessageToolCalls,
    MinP,
    MinTokens,
    NoRepeatNgramSize,
    NumBeams,
    Penalty,
    RepetitionPenalty,
    Seed,
    Stop,
    Suffix,
    Temperature,
    ToolChoice,
    Tools,
    TopK,
    TopLogprobs,
    TopP,
    TypicalP,
    User,
    normalize_content,
    normalize_prompt,
    refuse_when,
    validate_role,
)
from gateway.openai.limits import MAX_MESSAGES, MAX_PROMPT_TOKENS, MAX_PROMPTS, MAX_TOKEN_ID


class _Request(BaseModel):
    # inf and nan parse from JSON (1e999, NaN) but are no sampling parameter's value.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Request):
    include_usage: bool | None = Field(None, description="Send a final chunk carrying the usage.")


class ResponseFormat(_Request):
    type: Annotated[
        str,
        Field(description="Only `text` is supported for now."),
        refuse_when(lambda kind: kind != "text", "Only response_format type 'text' is supported yet."),
    ]


class TextContentPart(_Request):
    type: Literal["text"] = Field(description="Only text parts are supported.")
    text: str


class ChatMessageParam(_Request):
    role: Annotated[
        str,
        AfterValidator(validate_role),
        Field(description="system, developer, user or assistant (tool roles are not supported yet)."),
    ]
    content: Annotated[
        str | list[TextContentPart],
        BeforeValidator(normalize_content),
        Field(description="Text, or a list of text parts (joined with newlines)."),
    ]
    name: str | None = Field(None, description="Optional participant name.")
    tool_calls: MessageToolCalls = None


class _GenerationRequest(_Request):
    """Fields chat and text completions share: the model and every sampling parameter.

    The HuggingFace parameters after ``user`` are tokenferry extensions; the
    OpenAI SDK sends them from ``extra_body``, which lands at the top level.
    """

    model: str = Field(description="Name of a model served by a live worker.")
    frequency_penalty: Penalty = None
    logit_bias: LogitBias = None
    max_tokens: MaxTokens = None
    n: ChoiceCount = None
    presence_penalty: Penalty = None
    seed: Seed = None
    stop: Stop = None
    stream: bool | None = Field(None, description="Stream chunks as server-sent events.")
    stream_options: StreamOptions | None = Field(None, description="Options for streaming.")
    temperature: Temperature = None
    top_p: TopP = None
    user: User = None
    top_k: TopK = None
    typical_p: TypicalP = None
    min_p: MinP = None
    repetition_penalty: RepetitionPenalty = None
    length_penalty: LengthPenalty = None
    no_repeat_ngram_size: NoRepeatNgramSize = None
    num_beams: NumBeams = None
    min_tokens: MinTokens = None
    ignore_eos: IgnoreEos = None


class ChatCompletionRequest(_GenerationRequest):
    """Body of POST /v1/chat/completions."""

    messages: list[ChatMessageParam] = Field(
        min_length=1, max_length=MAX_MESSAGES, description="The conversation so far."
    )
    function_call: FunctionCall = None
    functions: Functions = None
    logprobs: ChatLogprobs = None
    max_completion_tokens: MaxTokens = None
    response_format: ResponseFormat | None = Field(None, description="Only {'type': 'text'} for now.")
    tool_choice: ToolChoice = None
    tools: Tools = None
    top_logprobs: TopLogprobs = None


# The four prompt forms OpenAI accepts (documented with their bounds), normalised to a list of
# prompts (validated by normalize_prompt).
_TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
_TokenIds = Annotated[list[_TokenId], Field(min_length=1, max_length=MAX_PROMPT_TOKENS)]
PromptInput = (
    str
    | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
    | _TokenIds
    | Annotated[list[_TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
)


class CompletionRequest(_GenerationRequest):
    """Body of POST /v1/completions."""

    prompt: Annotated[
        list[str | list[int]],
        BeforeValidator(normalize_prompt, json_schema_input_type=PromptInput),
        Field(
            description="A string, a list of strings, token ids, or a list of token-id lists; "
            "each prompt gets n choices, indexed prompt_index * n + i."
        ),
    ]
    best_of: BestOf = None
    echo: bool | None = Field(
        None, description="Prepend the prompt to the completion (with logprobs: the prompt's logprobs too)."
    )
    logprobs: CompletionLogprobs = None
    suffix: Suffix = None


# Responses. Field order follows OpenAI's, so serialized objects read like theirs.

FinishReasonName = Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


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
    content: str


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


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error envelope: every error response and mid-stream failure has this shape."""

    error: ErrorObject
