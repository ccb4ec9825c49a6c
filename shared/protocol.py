"""Owns the wire contract between gateway and worker: generation jobs and token events.

Everything here is JSON on Redis, versioned by ``v``. A reader refuses versions it
does not know instead of guessing. ``None`` in a ``SamplingSpec`` means "not given
by the client": the worker then applies the server default, then the model's
``generation_config.json``, then the library default.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.errors import ErrorInfo

PROTOCOL_VERSION = 1


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = PROTOCOL_VERSION

    @model_validator(mode="after")
    def _known_version(self) -> _Wire:
        if self.v != PROTOCOL_VERSION:
            raise ValueError(
                f"protocol version {self.v} is not supported (this side speaks {PROTOCOL_VERSION})"
            )
        return self


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    # The choice ended by calling tools (its text parsed as tool calls).
    TOOL_CALLS = "tool_calls"


class SamplingSpec(_Part):
    """HuggingFace generation parameters as the client gave them; None means "default"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    typical_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    num_beams: int | None = None
    min_tokens: int | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    stop: list[str] | None = None
    logit_bias: dict[int, float] | None = None


class ToolCall(_Part):
    """A call the assistant made, as it comes back in an agent's history."""

    id: str
    name: str
    # The arguments as JSON text, exactly as OpenAI carries them.
    arguments: str


class ChatMessage(_Part):
    role: str
    # None for an assistant message that only calls tools.
    content: str | None
    name: str | None = None
    # An assistant message's calls, replayed to the template.
    tool_calls: list[ToolCall] | None = None
    # A ``tool`` message answers the call with this id.
    tool_call_id: str | None = None


class FunctionTool(_Part):
    """A function the model may call; ``parameters`` is its arguments' JSON schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoice(_Part):
    """How the worker treats the tools of a chat prompt.

    ``auto``: the model chooses, the worker's tool-call parser finds calls in its text;
    ``required``: output constrained to a list of calls of the given tools;
    ``named``: output constrained to the arguments of ``name``;
    ``none``: no call is parsed (the tools still reach the template).
    """

    mode: Literal["none", "auto", "required", "named"] = "auto"
    name: str | None = None
    parallel: bool = True


class TextPrompt(_Part):
    kind: Literal["text"] = "text"
    text: str


class TokenPrompt(_Part):
    kind: Literal["tokens"] = "tokens"
    token_ids: list[int]


class ChatPrompt(_Part):
    """Chat messages; the worker owns the template that turns them into tokens."""

    kind: Literal["chat"] = "chat"
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    # Given to the template as ``tools`` (or described in the fallback system message).
    tools: list[FunctionTool] | None = None
    # Extra template variables (``enable_thinking``), over the server's defaults.
    template_kwargs: dict[str, Any] | None = None


Prompt = Annotated[TextPrompt | TokenPrompt | ChatPrompt, Field(discriminator="kind")]


# Structured outputs: what the generated text must match, enforced token by token
# (``shared/structured/``). Each names the request parameter it came from, so errors found
# later (a grammar that does not compile for this tokenizer) still name it.


class JsonConstraint(_Part):
    kind: Literal["json"] = "json"
    # None: any JSON object (``response_format: json_object``).
    json_schema: dict[str, Any] | None = None
    param: str = "response_format"


class RegexConstraint(_Part):
    kind: Literal["regex"] = "regex"
    pattern: str
    param: str = "structured_outputs.regex"


class ChoiceConstraint(_Part):
    kind: Literal["choice"] = "choice"
    choices: list[str] = Field(min_length=1)
    param: str = "structured_outputs.choice"


class GrammarConstraint(_Part):
    """A context-free grammar: Lark syntax (llguidance's), or GBNF (llama.cpp's, converted)."""

    kind: Literal["grammar"] = "grammar"
    grammar: str
    param: str = "structured_outputs.grammar"


Constraint = Annotated[
    JsonConstraint | RegexConstraint | ChoiceConstraint | GrammarConstraint, Field(discriminator="kind")
]


# The most alternatives a client may ask per token (OpenAI's top_logprobs bound).
MAX_TOP_LOGPROBS = 20


class GenerationJob(_Wire):
    request_id: str
    model: str
    prompt: Prompt
    sampling: SamplingSpec = SamplingSpec()
    echo: bool = False
    created_at: float
    # Choices generated from this one prompt; all publish to the request's one stream.
    n: int = Field(1, ge=1)
    # None: no logprobs; 0: the chosen token's; k: plus the k most likely alternatives.
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # Also score the prompt's tokens (completions' echo with logprobs); same meaning of k.
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # Wall-clock time (epoch s) after which nobody waits for this job: it must not start.
    deadline_at: float | None = None
    # 0 for the first run; k for the k-th takeover, which resumes from the events already streamed.
    attempt: int = Field(0, ge=0)
    # The queue it runs from: batch work fills spare capacity, interactive work always goes first.
    lane: Literal["interactive", "batch"] = "interactive"
    # What the output must match (structured outputs); None: free text.
    constraint: Constraint | None = None
    # How the worker treats the chat prompt's tools; None: no tools.
    tool_choice: ToolChoice | None = None


class Usage(_Part):
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0  # of the completion tokens, the thinking's (with a reasoning parser)
    cached_tokens: int = 0  # of the prompt tokens, those served from the prefix cache (where reported)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Accepted(_Wire):
    """First event of every successful request: the prompt passed the worker's checks."""

    type: Literal["accepted"] = "accepted"
    prompt_tokens: int
    worker_id: str
    # The prompt as text, filled only when the job asked for echo.
    prompt_text: str | None = None


class TopLogprob(_Part):
    """One candidate token at a position, scored by the model's raw log-softmax."""

    token_id: int
    # The token's text as decoded alone (a partial UTF-8 character decodes to U+FFFD).
    token: str
    logprob: float


class TokenLogprob(TopLogprob):
    """The chosen token at a position, with the most likely alternatives when asked."""

    top: list[TopLogprob] = []


class PromptLogprob(_Part):
    """A prompt token scored by what precedes it; the first token has nothing before it (None)."""

    token_id: int
    token: str
    logprob: float | None
    top: list[TopLogprob] = []


class ToolCallDelta(_Part):
    """A fragment of a tool call; a call's first fragment carries its id and name."""

    # The call's place among the choice's calls (0, 1, ...).
    index: int
    id: str | None = None
    name: str | None = None
    # The next piece of the arguments' JSON text.
    arguments: str = ""


class Delta(_Wire):
    type: Literal["delta"] = "delta"
    # The answer's text (``content``): what is left once reasoning and tool calls are split off.
    text: str
    token_ids: list[int]
    # Which choice (0..n-1) of the request this text belongs to.
    index: int = 0
    # One entry per generated token whose text this delta completes, when the job asked.
    logprobs: list[TokenLogprob] | None = None
    # On a choice's first delta when the job asked: one entry per prompt token.
    prompt_logprobs: list[PromptLogprob] | None = None
    # Text the reasoning parser split off as the model's thinking (``reasoning_content``).
    reasoning: str = ""
    # Tool-call fragments parsed from the output.
    tool_calls: list[ToolCallDelta] | None = None


class ChoiceFinished(_Wire):
    """One choice ended (not terminal: the request ends with ``Finished`` once all choices have)."""

    type: Literal["choice_finished"] = "choice_finished"
    index: int
    finish_reason: FinishReason
    completion_tokens: int
    stop_sequence: str | None = None
    reasoning_tokens: int = 0


class Finished(_Wire):
    """The request's terminal event, after every choice's ``ChoiceFinished``; usage sums the choices."""

    type: Literal["finished"] = "finished"
    # The reason of the choice that ended last (per-choice reasons are on ``ChoiceFinished``).
    finish_reason: FinishReason
    usage: Usage
    # The stop sequence that ended generation, when one did (trimmed from the text).
    stop_sequence: str | None = None


class Failed(_Wire):
    type: Literal["failed"] = "failed"
    error: ErrorInfo


TokenEvent = Annotated[Accepted | Delta | ChoiceFinished | Finished | Failed, Field(discriminator="type")]
TERMINAL_EVENT_TYPES = frozenset({"finished", "failed"})


class TokenizeJob(_Wire):
    """Tokenize a text or chat prompt, or detokenize a ``TokenPrompt``, on a worker of ``model``.

    Only workers hold tokenizers; the answer goes to ``keys.reply(request_id)``.
    """

    request_id: str
    model: str
    prompt: Prompt
    add_special_tokens: bool = True


class Tokenized(_Wire):
    type: Literal["tokenized"] = "tokenized"
    tokens: list[int]
    # The prompt as text: the rendered chat, or the decoded token ids.
    text: str
    max_model_len: int


TokenizeReply = Annotated[Tokenized | Failed, Field(discriminator="type")]
