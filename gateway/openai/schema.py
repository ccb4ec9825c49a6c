"""Owns the public OpenAI HTTP schema of requests (and the error envelope every response shares).

A request body refuses a top-level field it does not declare (OpenAI's 400
"Unrecognized request argument supplied"), so nothing a client asks for is dropped
silently; nested objects (messages, tools) ignore unknown keys, because clients
replay whole objects they were sent (an SDK's message with ``refusal: null``).
Requests document themselves through ``Field(description=...)`` and keep OpenAI's
field order, then our HuggingFace and vLLM extras. Field types, bounds and
refusals live in ``gateway/openai/fields.py``, agent fields (tools, response
formats, structured outputs) in ``gateway/openai/agent_schema.py``, fields accepted
without effect in ``gateway/openai/accepted_fields.py``; the objects we answer
with in ``gateway/openai/objects.py``. These models never leave the gateway:
translation to the job protocol is ``gateway/openai/translate.py``'s business.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from gateway.openai import accepted_fields as accepted
from gateway.openai.agent_schema import (
    Backend,
    CalledFunction,
    FunctionCall,
    Functions,
    GuidedChoice,
    GuidedJson,
    MessageToolCalls,
    ResponseFormat,
    StructuredOutputs,
    ToolChoice,
    Tools,
)
from gateway.openai.fields import (
    BestOf,
    ChatLogprobs,
    ChoiceCount,
    CompletionLogprobs,
    IgnoreEos,
    LengthPenalty,
    LogitBias,
    MaxTokens,
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
    TopK,
    TopLogprobs,
    TopP,
    TypicalP,
    User,
    normalize_content,
    normalize_prompt,
    validate_role,
)
from gateway.openai.limits import MAX_MESSAGES, MAX_PROMPT_TOKENS, MAX_PROMPTS, MAX_TOKEN_ID


class _Request(BaseModel):
    # inf and nan parse from JSON (1e999, NaN) but are no sampling parameter's value.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Request):
    include_usage: bool | None = Field(None, description="Send a final chunk carrying the usage.")
    include_obfuscation: accepted.IncludeObfuscation = None


class TextContentPart(_Request):
    type: Literal["text"] = Field(description="Only text parts are supported.")
    text: str


class ChatMessageParam(_Request):
    role: Annotated[
        str,
        AfterValidator(validate_role),
        Field(description="system, developer, user, assistant, tool, or function (deprecated tool)."),
    ]
    content: Annotated[
        str | list[TextContentPart] | None,
        BeforeValidator(normalize_content),
        Field(description="Text or text parts (joined with newlines); null: an assistant's calls only."),
    ] = None
    name: str | None = Field(None, description="Participant name; a function message's function.")
    tool_calls: MessageToolCalls = None
    tool_call_id: str | None = Field(None, description="A tool message answers the call with this id.")
    function_call: CalledFunction | None = Field(None, description="Deprecated form of one tool call.")

    @model_validator(mode="after")
    def _complete(self) -> ChatMessageParam:
        if self.content is None and not (
            self.role == "assistant" and (self.tool_calls or self.function_call)
        ):
            raise PydanticCustomError(
                "missing_content", "Only an assistant message that calls tools may have no content."
            )
        if self.role == "tool" and not self.tool_call_id:
            raise PydanticCustomError(
                "missing_tool_call_id", "A tool message needs the tool_call_id it answers."
            )
        if self.role == "function" and not self.name:
            raise PydanticCustomError("missing_name", "A function message needs the function's name.")
        return self


class _GenerationRequest(_Request):
    """Fields chat and text completions share: the model and every sampling parameter.

    The HuggingFace parameters after ``user`` are tokenferry extensions; the
    OpenAI SDK sends them from ``extra_body``, which lands at the top level.
    Unknown fields are refused (as OpenAI refuses them): a field we would drop
    silently might have been asked for. Structured-output fields come last:
    ``response_format`` (OpenAI's), then vLLM's ``structured_outputs`` and its older
    ``guided_*`` forms; at most one of them may constrain the output.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    response_format: ResponseFormat | None = Field(None, description="text, json_object or json_schema.")
    structured_outputs: StructuredOutputs | None = Field(None, description="vLLM's structured outputs.")
    guided_json: GuidedJson = None
    guided_regex: str | None = Field(None, description="Older vLLM form of structured_outputs.regex.")
    guided_choice: GuidedChoice = None
    guided_grammar: str | None = Field(None, description="Older vLLM form of structured_outputs.grammar.")
    guided_decoding_backend: Backend = None
    skip_special_tokens: accepted.SkipSpecialTokens = None
    include_stop_str_in_output: accepted.IncludeStopStrInOutput = None
    spaces_between_special_tokens: accepted.SpacesBetweenSpecialTokens = None


class ChatCompletionRequest(_GenerationRequest):
    """Body of POST /v1/chat/completions."""

    messages: list[ChatMessageParam] = Field(
        min_length=1, max_length=MAX_MESSAGES, description="The conversation so far."
    )
    audio: accepted.Audio = None
    function_call: FunctionCall = None
    functions: Functions = None
    logprobs: ChatLogprobs = None
    max_completion_tokens: MaxTokens = None
    metadata: accepted.Metadata = None
    modalities: accepted.Modalities = None
    moderation: accepted.Moderation = None
    parallel_tool_calls: bool | None = Field(
        None, description="Allow several calls in one answer (default true)."
    )
    prediction: accepted.Prediction = None
    prompt_cache_key: accepted.PromptCacheKey = None
    prompt_cache_options: accepted.PromptCacheOptions | None = Field(
        None, description="Implicit caching only."
    )
    prompt_cache_retention: accepted.PromptCacheRetention = None
    reasoning_effort: accepted.ReasoningEffort = None
    safety_identifier: accepted.SafetyIdentifier = None
    service_tier: accepted.ServiceTier = None
    store: accepted.Store = None
    tool_choice: ToolChoice = None
    tools: Tools = None
    top_logprobs: TopLogprobs = None
    verbosity: accepted.Verbosity = None
    web_search_options: accepted.WebSearchOptions = None
    chat_template: accepted.ChatTemplate = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Extra chat template variables (enable_thinking...), over the server's defaults."
    )
    add_generation_prompt: accepted.AddGenerationPrompt = None
    continue_final_message: accepted.ContinueFinalMessage = None


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


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error envelope: every error response and mid-stream failure has this shape."""

    error: ErrorObject
