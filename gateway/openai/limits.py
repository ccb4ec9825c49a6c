"""Owns the bounds on what one request may ask, shared by every route: counts, lengths, ranges.

Each bound keeps one tenant's request from costing the shared workers or Redis
more than a request can be worth (a stop sequence the worker's matcher holds, a
token id no vocabulary has, a list no context fits). The OpenAI, TGI and
Responses schemas, and batch lines (which are OpenAI request bodies), all use
these. Checks raise a ``PydanticCustomError`` with a sentence meant for the
client; ``gateway/http/errors.py`` turns its location into the 400's ``param``.

Where OpenAI documents a bound (4 stop sequences, 2,048 messages, 20
``top_logprobs``, ``logit_bias`` values in [-100, 100]) we use it; the others are
generous constants, far past any real request. Limits that depend on the model
(vocabulary size, context window, beam width a worker can afford) are the
worker's to check: these only keep a request's size bounded on its way there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

MAX_STOP_SEQUENCES = 4
# Characters in one stop sequence: ample for any delimiter or end-of-turn marker.
MAX_STOP_CHARS = 512
# Prompts one /v1/completions request may list; each runs as its own job.
MAX_PROMPTS = 64
# Token ids in one prompt: above any context window served; the worker refuses past its own.
MAX_PROMPT_TOKENS = 1_048_576
# Every vocabulary fits an int32, so a token id above it is a mistake, not a token.
MAX_TOKEN_ID = 2**31 - 1
# Token counts (max_tokens, min_tokens, top_k...): an int32 too, far beyond any context.
MAX_TOKEN_COUNT = 2**31 - 1
# OpenAI's bound on messages per chat request; text parts per message get the same.
MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 2048
# The schema's ceiling on n; the operator's (smaller) ``max_n`` is checked per request.
MAX_CHOICES = 128
# The schema's ceiling on beam width; each worker refuses past its own (smaller) maximum.
MAX_BEAMS = 32
# OpenAI's bound on top_logprobs (and vLLM's on completions' logprobs).
MAX_TOP_LOGPROBS = 20
# OpenAI's: logit_bias takes at most 1,024 tokens, each biased by -100 to 100.
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_LOGIT_BIAS = 100
_TOKEN_ID_DIGITS = len(str(MAX_TOKEN_ID))


def validate_stop(stop: str | list[str] | None) -> str | list[str] | None:
    """At most four stop sequences, none of them empty (an empty one would stop at once) or long."""
    sequences = [stop] if isinstance(stop, str) else stop or []
    if len(sequences) > MAX_STOP_SEQUENCES:
        raise PydanticCustomError("too_many_stops", "At most 4 stop sequences are allowed.")
    if any(not sequence for sequence in sequences):
        raise PydanticCustomError("empty_stop", "Stop sequences must not be empty.")
    if any(len(sequence) > MAX_STOP_CHARS for sequence in sequences):
        raise PydanticCustomError(
            "stop_too_long", "Each stop sequence has at most {most} characters.", {"most": MAX_STOP_CHARS}
        )
    return stop


# What ``validate_stop`` accepts, for /openapi.json (its checks give clearer errors than the schema's).
STOP_STRING_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
STOP_LIST_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": STOP_STRING_SCHEMA,
    "maxItems": MAX_STOP_SEQUENCES,
}


def check_token_ids(token_ids: list[int]) -> list[int]:
    """A prompt's token ids: a bounded count, each a possible token id."""
    if len(token_ids) > MAX_PROMPT_TOKENS:
        raise PydanticCustomError(
            "too_many_tokens", "At most {most} token ids per prompt.", {"most": MAX_PROMPT_TOKENS}
        )
    if any(not 0 <= token_id <= MAX_TOKEN_ID for token_id in token_ids):
        raise PydanticCustomError(
            "invalid_prompt", "Token ids must be integers from 0 to {most}.", {"most": MAX_TOKEN_ID}
        )
    return token_ids


def check_count(count: int, most: int, what: str) -> None:
    """Refuse a list longer than ``most`` before its items are checked one by one."""
    if count > most:
        raise PydanticCustomError("too_many", "At most {most} {what}.", {"most": most, "what": what})


def as_list(item: type, most: int, noun: str, wrap: Callable[[str], Any]) -> BeforeValidator:
    """Accept a string for a list of at most ``most`` items: the string becomes ``[wrap(string)]``.

    Declared as ``str | list[...]``, the field would report a bad item once per union
    branch, with branch names in the location (``input.str``); as a list, each
    problem is reported once, at its own place (``input.3.content``). The schema
    still documents both forms.
    """

    def check(value: Any) -> Any:
        if isinstance(value, str):
            return [wrap(value)]
        if not isinstance(value, list):
            raise PydanticCustomError(
                "invalid_type", "Expected a string or a list of {noun}.", {"noun": noun}
            )
        check_count(len(value), most, noun)
        return value

    documented = str | Annotated[list[item], Field(max_length=most)]  # type: ignore[valid-type]
    return BeforeValidator(check, json_schema_input_type=documented)


def check_logit_bias(biases: dict[str, float]) -> dict[str, float]:
    """Keys are token ids in decimal, values in [-100, 100]; at most 1,024 entries.

    Checked here rather than by typed keys and values so that every problem is
    reported as the map's, whatever key it is under.
    """
    if len(biases) > MAX_LOGIT_BIAS_ENTRIES:
        raise PydanticCustomError(
            "logit_bias", "logit_bias takes at most {most} tokens.", {"most": MAX_LOGIT_BIAS_ENTRIES}
        )
    for token, bias in biases.items():
        # str.isdigit() alone accepts "²" and other digits int() refuses.
        if not (token.isascii() and token.isdigit() and len(token) <= _TOKEN_ID_DIGITS) or (
            int(token) > MAX_TOKEN_ID
        ):
            raise PydanticCustomError(
                "logit_bias",
                "logit_bias keys must be token ids (decimal digits, 0 to {most}), got '{token}'.",
                {"token": token, "most": MAX_TOKEN_ID},
            )
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:  # NaN fails this too
            raise PydanticCustomError("logit_bias", "logit_bias values must be in [-100, 100].")
    return biases


_LOGIT_BIAS_SCHEMA = {
    "type": "object",
    "patternProperties": {
        f"^[0-9]{{1,{_TOKEN_ID_DIGITS}}}$": {
            "type": "number",
            "minimum": -MAX_LOGIT_BIAS,
            "maximum": MAX_LOGIT_BIAS,
        }
    },
    "additionalProperties": False,
    "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
}
# Non-finite values are let through the float check so that the range check names the map.
LogitBiasMap = Annotated[
    dict[str, Annotated[float, Field(allow_inf_nan=True)]],
    AfterValidator(check_logit_bias),
    WithJsonSchema(_LOGIT_BIAS_SCHEMA),
]
