"""Owns the OpenAI request fields tokenferry accepts without acting on them, and those it refuses by value.

Request bodies refuse any field they do not declare (400 "Unrecognized request
argument", as OpenAI answers), so every field a client may send is one of three
kinds: honoured (the rest of ``gateway/openai/``), accepted because ignoring it
changes nothing the client can observe (the reason is its description), or
refused with a 400 naming it. A field that is harmless at one value and not at
another (``store: false`` and ``store: true``) is accepted at the first and refused
at the second. The table in the docs lists each field's kind.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from gateway.openai.fields import refuse_when

# OpenAI's bounds on metadata: 16 pairs, keys of 64 characters, values of 512.
MAX_METADATA_PAIRS = 16


def _is_not_none(value: Any) -> bool:
    return value is not None


def _is_true(value: Any) -> bool:
    return value is True


def _asks_audio(value: Any) -> bool:
    return value is not None and "audio" in value


def _is_not(*harmless: str) -> Any:
    def asks_other(value: Any) -> bool:
        return value is not None and value not in harmless

    return asks_other


Audio = Annotated[
    dict[str, Any] | None,
    Field(description="Refused: no audio output."),
    refuse_when(_is_not_none, "Audio output is not supported (text only)."),
]
Modalities = Annotated[
    list[Literal["text", "audio"]] | None,
    Field(description='Only ["text"].'),
    refuse_when(_asks_audio, "Only the text modality is supported."),
]
Store = Annotated[
    bool | None,
    Field(description="Only false: completions are not stored for later retrieval."),
    refuse_when(_is_true, "store: true is not supported (completions are not stored)."),
]
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None,
    Field(
        max_length=MAX_METADATA_PAIRS,
        description="Accepted and not kept: it tags stored completions, and none are stored.",
    ),
]
ServiceTier = Annotated[
    Literal["auto", "default", "flex", "scale", "priority", "fast"] | None,
    Field(description="auto or default: this server has one processing tier."),
    refuse_when(_is_not("auto", "default"), "Only service_tier auto or default is available here."),
]
WebSearchOptions = Annotated[
    dict[str, Any] | None,
    Field(description="Refused: no web search."),
    refuse_when(_is_not_none, "Web search is not supported."),
]
Verbosity = Annotated[
    Literal["low", "medium", "high"] | None,
    Field(description="Only medium (the model's own length); low and high are not enforceable."),
    refuse_when(_is_not("medium"), "Only verbosity medium is supported (output length is the model's own)."),
]
ReasoningEffort = Annotated[
    Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None,
    Field(
        description="Given to the chat template as `reasoning_effort` (templates that read it honour it); "
        "chat_template_kwargs may set it too."
    ),
]
PromptCacheKey = Annotated[
    str | None,
    Field(
        max_length=1024,
        description="Accepted: each worker's prefix cache reuses any shared prefix without a key.",
    ),
]
# The SDK spells it in_memory; OpenAI's reference once wrote in-memory.
PromptCacheRetention = Annotated[
    Literal["in_memory", "in-memory", "24h"] | None,
    Field(description="Only in_memory: prefixes stay cached while the worker's memory allows."),
    refuse_when(_is_not("in_memory", "in-memory"), "Only prompt_cache_retention in_memory is supported."),
]


class PromptCacheOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["implicit", "explicit"] | None = Field(
        None, description="Only implicit: each worker's prefix cache finds shared prefixes itself."
    )
    ttl: Literal["30m"] | None = Field(None, description="Accepted: prefixes stay while memory allows.")

    @field_validator("mode")
    @classmethod
    def _implicit(cls, mode: str | None) -> str | None:
        if mode == "explicit":
            raise PydanticCustomError(
                "not_supported", "Only implicit prompt caching is supported (no cache breakpoints)."
            )
        return mode


Moderation = Annotated[
    dict[str, Any] | None,
    Field(description="Refused: no moderation model runs here."),
    refuse_when(_is_not_none, "Moderation is not available on this server."),
]
SafetyIdentifier = Annotated[
    str | None, Field(max_length=1024, description="End-user id for abuse detection; accepted and ignored.")
]


Prediction = Annotated[
    dict[str, Any] | None,
    Field(description="Accepted: a latency hint (the output is what it would be without it)."),
]
ChatTemplate = Annotated[
    str | None,
    Field(description="Refused: the worker applies its model's own template."),
    refuse_when(_is_not_none, "A per-request chat_template is not supported; the model's template is used."),
]
AddGenerationPrompt = Annotated[
    bool | None, Field(description="vLLM's: end the prompt with the assistant's turn opening (default true).")
]
IncludeObfuscation = Annotated[
    bool | None, Field(description="Accepted: chunks are never padded (no obfuscation field is sent).")
]


# vLLM's output switches, accepted at the value this server always behaves as.
def _only(value: bool, name: str, reason: str) -> Any:
    return Annotated[
        bool | None,
        Field(description=f"Only {str(value).lower()}: {reason}"),
        refuse_when(
            lambda given: given is not None and given is not value,
            f"{name} must be {str(value).lower()}: {reason}",
        ),
    ]


SkipSpecialTokens = _only(True, "skip_special_tokens", "special tokens are never part of the text.")
IncludeStopStrInOutput = _only(
    False, "include_stop_str_in_output", "a stop sequence is always trimmed from the text."
)
ContinueFinalMessage = _only(False, "continue_final_message", "the answer is always a new assistant message.")
SpacesBetweenSpecialTokens = Annotated[
    bool | None, Field(description="Accepted: special tokens are skipped, so there is nothing to space.")
]
