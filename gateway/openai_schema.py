"""Owns the public OpenAI HTTP schema: request and response models of the endpoints we serve.

Requests ignore fields they do not know (clients send many we have no use for),
document themselves through ``Field(description=...)`` and keep OpenAI's field
order. A feature we do not implement yet is refused here with a 400 naming the
field, never silently dropped. These models never leave the gateway: translation
to the job protocol is ``gateway/translate.py``'s business.

Intentional divergence: ``tools``, ``functions`` and ``logit_bias`` are refused
only when they ask for something (an empty list or map, or ``tool_choice:
"none"``, is accepted), because several client libraries always send them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    MISSING,
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)
from pydantic_core import PydanticCustomError

from gateway.openai_checks import normalize_content, normalize_prompt, validate_role, validate_stop

_T = TypeVar("_T")


def _refuse_when(is_requested: Callable[[Any], bool], message: str) -> AfterValidator:
    """A validator that refuses a field whose value asks for an unimplemented feature."""

    def check(value: _T) -> _T:
        if is_requested(value):
            raise PydanticCustomError("not_supported", message)
        return value

    return AfterValidator(check)


def _is_truthy(value: Any) -> bool:
    return bool(value)


def _is_not_none(value: Any) -> bool:
    return value is not None


def _is_more_than_one(value: Any) -> bool:
    return value is not None and value > 1


def _is_a_tool_choice(value: Any) -> bool:
    return value is not None and value != "none"


# Field types shared by both request bodies, each with its constraints and description.
MaxTokens = Annotated[int | None, Field(ge=1, description="Most tokens to generate; default: the context.")]
Temperature = Annotated[float | None, Field(ge=0, le=2, description="Sampling temperature, 0 to 2.")]
TopP = Annotated[float | None, Field(gt=0, le=1, description="Nucleus sampling probability mass.")]
Penalty = Annotated[float | None, Field(ge=-2, le=2, description="OpenAI-style penalty, -2 to 2.")]
ChoiceCount = Annotated[
    int | None,
    Field(ge=1, description="Number of choices; only 1 is supported for now."),
    _refuse_when(_is_more_than_one, "Only one choice per request (n=1) is supported for now."),
]
BestOf = Annotated[
    int | None,
    Field(ge=1, description="Candidates to rank; only 1 is supported for now."),
    _refuse_when(_is_more_than_one, "best_of greater than 1 is not supported yet."),
]
Stop = Annotated[
    str | list[str] | None,
    AfterValidator(validate_stop),
    Field(description="Up to 4 sequences where generation stops; not included in the output."),
]
Seed = Annotated[int | None, Field(description="Seed for reproducible sampling.")]
User = Annotated[str | None, Field(description="End-user id; accepted and ignored.")]
LogitBias = Annotated[
    dict[str, float] | None,
    Field(description="Not supported yet."),
    _refuse_when(_is_truthy, "logit_bias is not supported yet."),
]

# HuggingFace generation parameters, accepted at the top level (where `extra_body` lands).
TopK = Annotated[int | None, Field(ge=-1, description="Keep the k most likely tokens; -1 or 0 disable.")]
TypicalP = Annotated[float | None, Field(gt=0, le=1, description="Locally typical sampling mass.")]
MinP = Annotated[float | None, Field(ge=0, le=1, description="Minimum probability relative to the top token.")]
RepetitionPenalty = Annotated[float | None, Field(gt=0, description="Multiplicative penalty; 1 disables.")]
LengthPenalty = Annotated[float | None, Field(description="Beam-search length penalty exponent.")]
NoRepeatNgramSize = Annotated[int | None, Field(ge=0, description="Never repeat an n-gram of this size.")]
NumBeams = Annotated[int | None, Field(ge=1, description="Beam-search width; 1 means sampling/greedy.")]
MinTokens = Annotated[
    int | None,
    Field(
        ge=0,
        validation_alias=AliasChoices("min_tokens", "min_length"),
        description="Generate at least this many tokens (alias: min_length).",
    ),
]
IgnoreEos = Annotated[bool | None, Field(description="Keep generating past the end-of-sequence token.")]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool | None = Field(None, description="Send a final chunk carrying the usage.")


class ResponseFormat(_Request):
    type: Annotated[
        str,
        Field(description="Only `text` is supported for now."),
        _refuse_when(lambda kind: kind != "text", "Only response_format type 'text' is supported yet."),
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
    tool_calls: Annotated[
        list[Any] | None,
        Field(description="Not supported yet."),
        _refuse_when(_is_truthy, "Tool calls in messages are not supported yet."),
    ] = None


class ChatCompletionRequest(_Request):
    """Body of POST /v1/chat/completions."""

    messages: list[ChatMessageParam] = Field(min_length=1, description="The conversation so far.")
    model: str = Field(description="Name of a model served by a live worker.")
    frequency_penalty: Penalty = None
    function_call: Annotated[
        Any, Field(description="Not supported."), _refuse_when(_is_a_tool_choice, "function_call is not supported.")
    ] = None
    functions: Annotated[
        list[Any] | None,
        Field(description="Not supported."),
        _refuse_when(_is_truthy, "functions are not supported."),
    ] = None
    logit_bias: LogitBias = None
    logprobs: Annotated[
        bool | None, Field(description="Not supported yet."), _refuse_when(_is_truthy, "logprobs is not supported yet.")
    ] = None
    max_completion_tokens: MaxTokens = None
    max_tokens: MaxTokens = None
    n: ChoiceCount = None
    presence_penalty: Penalty = None
    response_format: ResponseFormat | None = Field(None, description="Only {'type': 'text'} for now.")
    seed: Seed = None
    stop: Stop = None
    stream: bool | None = Field(None, description="Stream chunks as server-sent events.")
    stream_options: StreamOptions | None = Field(None, description="Options for streaming.")
    temperature: Temperature = None
    tool_choice: Annotated[
        Any, Field(description="Not supported yet."), _refuse_when(_is_a_tool_choice, "tool_choice is not supported yet.")
    ] = None
    tools: Annotated[
        list[Any] | None,
        Field(description="Not supported yet."),
        _refuse_when(_is_truthy, "Tool calling (tools) is not supported yet."),
    ] = None
    top_logprobs: Annotated[
        int | None,
        Field(description="Not supported yet."),
        _refuse_when(_is_truthy, "top_logprobs is not supported yet."),
    ] = None
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


class CompletionRequest(_Request):
    """Body of POST /v1/completions."""

    model: str = Field(description="Name of a model served by a live worker.")
    prompt: Annotated[
        str | list[int],
        BeforeValidator(normalize_prompt),
        Field(description="A string, a list of one string, token ids, or a list of one token-id list."),
    ]
    best_of: BestOf = None
    echo: bool | None = Field(None, description="Prepend the prompt to the completion.")
    frequency_penalty: Penalty = None
    logit_bias: LogitBias = None
    logprobs: Annotated[
        int | None,
        Field(description="Not supported yet."),
        _refuse_when(_is_not_none, "logprobs is not supported yet."),
    ] = None
    max_tokens: MaxTokens = None
    n: ChoiceCount = None
    presence_penalty: Penalty = None
    seed: Seed = None
    stop: Stop = None
    stream: bool | None = Field(None, description="Stream chunks as server-sent events.")
    stream_options: StreamOptions | None = Field(None, description="Options for streaming.")
    suffix: Annotated[
        str | None, Field(description="Not supported."), _refuse_when(_is_not_none, "suffix is not supported.")
    ] = None
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


# Responses. Field order follows OpenAI's, so serialized objects read like theirs.

FinishReasonName = Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
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
    logprobs: None = None
    finish_reason: FinishReasonName | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    # Present (null on all but the last) only when the client asked for include_usage.
    usage: Usage | None | MISSING = MISSING


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: FinishReasonName | None = None


class Completion(BaseModel):
    """A text_completion object; also each chunk of a streamed completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None | MISSING = MISSING


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
