"""Owns the wire contract between gateway and worker: generation jobs and token events.

Everything here is JSON on Redis, versioned by ``v``. A reader refuses versions it
does not know instead of guessing. ``None`` in a ``SamplingSpec`` means "not given
by the client": the worker then applies the server default, then the model's
``generation_config.json``, then the library default.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

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


class ChatMessage(_Part):
    role: str
    content: str
    name: str | None = None


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


Prompt = Annotated[TextPrompt | TokenPrompt | ChatPrompt, Field(discriminator="kind")]


class GenerationJob(_Wire):
    request_id: str
    model: str
    prompt: Prompt
    sampling: SamplingSpec = SamplingSpec()
    echo: bool = False
    created_at: float


class Usage(_Part):
    prompt_tokens: int
    completion_tokens: int

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


class Delta(_Wire):
    type: Literal["delta"] = "delta"
    text: str
    token_ids: list[int]


class Finished(_Wire):
    type: Literal["finished"] = "finished"
    finish_reason: FinishReason
    usage: Usage
    # The stop sequence that ended generation, when one did (trimmed from the text).
    stop_sequence: str | None = None


class Failed(_Wire):
    type: Literal["failed"] = "failed"
    error: ErrorInfo


TokenEvent = Annotated[Accepted | Delta | Finished | Failed, Field(discriminator="type")]
TERMINAL_EVENT_TYPES = frozenset({"finished", "failed"})
