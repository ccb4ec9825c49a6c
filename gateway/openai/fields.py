"""Owns the field types of OpenAI request bodies: their bounds, descriptions and checks.

``gateway/openai/schema.py`` composes its models from these, so both request
bodies validate a shared field the same way; the numbers they bound by are
``gateway/openai/limits.py``'s. Checks that a bound cannot express
raise a ``PydanticCustomError`` with a sentence meant for the client; its location
becomes the OpenAI ``param`` (``messages.2.content``). A feature we do not
implement yet is refused with a 400 naming the field, never silently dropped.

Tools, tool choices and structured-output fields are ``gateway/openai/agent_schema.py``'s;
fields accepted without effect, or refused by value, are ``gateway/openai/accepted_fields.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, AliasChoices, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from gateway.openai.limits import (
    MAX_BEAMS,
    MAX_CHOICES,
    MAX_CONTENT_PARTS,
    MAX_PROMPTS,
    MAX_TOKEN_COUNT,
    MAX_TOP_LOGPROBS,
    STOP_LIST_SCHEMA,
    STOP_STRING_SCHEMA,
    LogitBiasMap,
    check_count,
    check_token_ids,
    validate_stop,
)

_T = TypeVar("_T")

# ``function`` is the deprecated form of ``tool``: a function's result, named by ``name``.
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def validate_role(role: str) -> str:
    """Accept the chat roles a template can render."""
    if role not in CHAT_ROLES:
        raise PydanticCustomError(
            "invalid_role",
            "Invalid role '{role}': expected system, developer, user, assistant, tool or function.",
            {"role": role},
        )
    return role


def normalize_content(content: Any) -> Any:
    """Check message content is text or text parts, before the union tries its branches.

    Without this, a bad part would be reported once per union branch, with branch
    names in the location; here the client gets one sentence about the part.
    """
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise PydanticCustomError(
            "invalid_content", "Message content must be a string or a list of text parts."
        )
    check_count(len(content), MAX_CONTENT_PARTS, "content parts per message")
    for part in content:
        _check_part(part)
    return content


def _check_part(part: Any) -> None:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise PydanticCustomError("invalid_content", "Each content part must be an object with a 'type'.")
    if part["type"] != "text":
        raise PydanticCustomError(
            "not_supported",
            "Content parts of type '{kind}' are not supported yet; only text parts are.",
            {"kind": part["type"]},
        )
    if not isinstance(part.get("text"), str):
        raise PydanticCustomError("invalid_content", "A text content part needs a string 'text'.")


def normalize_prompt(prompt: Any) -> Any:
    """Reduce the four OpenAI prompt forms to a list of prompts, each a string or a list of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list):
        return prompt  # non-lists are left to the declared type to refuse
    if not prompt:
        raise PydanticCustomError("invalid_prompt", "The prompt must not be an empty list.")
    if all(_is_int(value) for value in prompt):
        return [check_token_ids(prompt)]
    check_count(len(prompt), MAX_PROMPTS, "prompts per request")
    return [_single_prompt(value) for value in prompt]


def _single_prompt(value: Any) -> str | list[int]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(_is_int(token) for token in value):
        return check_token_ids(value)
    raise PydanticCustomError(
        "invalid_prompt",
        "The prompt must be a string, a list of strings, a list of token ids or a list of token-id lists.",
    )


def _is_int(value: Any) -> bool:
    # bool is an int subclass, and `true` is not a token id.
    return isinstance(value, int) and not isinstance(value, bool)


def refuse_when(is_requested: Callable[[Any], bool], message: str) -> AfterValidator:
    """A validator refusing a value that asks for a feature we do not implement yet."""

    def check(value: _T) -> _T:
        if is_requested(value):
            raise PydanticCustomError("not_supported", message)
        return value

    return AfterValidator(check)


def _is_not_none(value: Any) -> bool:
    return value is not None


# Sampling fields of both request bodies.
MaxTokens = Annotated[
    int | None, Field(ge=1, le=MAX_TOKEN_COUNT, description="Most tokens to generate; default: the context.")
]
Temperature = Annotated[float | None, Field(ge=0, le=2, description="Sampling temperature, 0 to 2.")]
TopP = Annotated[float | None, Field(gt=0, le=1, description="Nucleus sampling probability mass.")]
Penalty = Annotated[float | None, Field(ge=-2, le=2, description="OpenAI-style penalty, -2 to 2.")]
Stop = Annotated[
    str | list[str] | None,
    AfterValidator(validate_stop),
    WithJsonSchema({"anyOf": [STOP_STRING_SCHEMA, STOP_LIST_SCHEMA, {"type": "null"}]}),
    Field(description="Up to 4 sequences (512 characters each) where generation stops; not in the output."),
]
# int64, as vLLM bounds it: torch's generators refuse seeds of 2**64 and more.
Seed = Annotated[int | None, Field(ge=-(2**63), le=2**63 - 1, description="Seed for reproducible sampling.")]
User = Annotated[str | None, Field(description="End-user id; accepted and ignored.")]

# HuggingFace generation parameters, accepted at the top level (where `extra_body` lands).
TopK = Annotated[
    int | None,
    Field(ge=-1, le=MAX_TOKEN_COUNT, description="Keep the k most likely tokens; -1 or 0 disable."),
]
TypicalP = Annotated[float | None, Field(gt=0, le=1, description="Locally typical sampling mass.")]
MinP = Annotated[float | None, Field(ge=0, le=1, description="Least probability relative to the top token.")]
RepetitionPenalty = Annotated[float | None, Field(gt=0, description="Multiplicative penalty; 1 disables.")]
LengthPenalty = Annotated[float | None, Field(description="Beam-search length penalty exponent.")]
NoRepeatNgramSize = Annotated[
    int | None, Field(ge=0, le=MAX_TOKEN_COUNT, description="Never repeat an n-gram of this size.")
]
NumBeams = Annotated[
    int | None,
    Field(
        ge=1,
        le=MAX_BEAMS,
        description="Beam-search width; 1 means sampling/greedy. Each worker may allow fewer.",
    ),
]
MinTokens = Annotated[
    int | None,
    Field(
        ge=0,
        le=MAX_TOKEN_COUNT,
        validation_alias=AliasChoices("min_tokens", "min_length"),
        description="Generate at least this many tokens (alias: min_length).",
    ),
]
IgnoreEos = Annotated[bool | None, Field(description="Keep generating past the end-of-sequence token.")]

ChoiceCount = Annotated[
    int | None,
    Field(
        ge=1,
        le=MAX_CHOICES,
        description="Choices to generate (for each prompt); at most the server's max_n (default 16).",
    ),
]
BestOf = Annotated[
    int | None,
    Field(
        ge=1,
        le=MAX_CHOICES,
        description="Accepted only equal to n (every candidate is returned; none is ranked away).",
    ),
]
LogitBias = Annotated[
    LogitBiasMap | None,
    Field(description="Token id (as a string) -> bias in [-100, 100] added to that token's logit."),
]
ChatLogprobs = Annotated[
    bool | None,
    Field(description="Return the log probability of each generated token (raw model distribution)."),
]
TopLogprobs = Annotated[
    int | None,
    Field(
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Also return this many most likely tokens at each position (needs logprobs: true).",
    ),
]
CompletionLogprobs = Annotated[
    int | None,
    Field(
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Return each token's log probability and this many most likely alternatives.",
    ),
]
Suffix = Annotated[
    str | None,
    Field(description="Not supported (no fill-in-the-middle): refused when given."),
    refuse_when(_is_not_none, "suffix is not supported (this server does no fill-in-the-middle)."),
]
