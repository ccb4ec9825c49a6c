"""Owns the checks on OpenAI request values that a type or a bound cannot express.

Used as validators by ``gateway/openai_schema.py``. Each raises a
``PydanticCustomError`` with a sentence meant for the client; the error's location
becomes the OpenAI ``param`` (for example ``messages.2.content``).
"""

from __future__ import annotations

from typing import Any

from pydantic_core import PydanticCustomError

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
_TOOL_ROLES = frozenset({"tool", "function"})
MAX_STOP_SEQUENCES = 4


def validate_role(role: str) -> str:
    """Accept the chat roles we can template; tool roles get their own explanation."""
    if role in _TOOL_ROLES:
        raise PydanticCustomError(
            "not_supported", "Messages with role '{role}' are not supported yet (no tool calling).", {"role": role}
        )
    if role not in CHAT_ROLES:
        raise PydanticCustomError(
            "invalid_role",
            "Invalid role '{role}': expected system, developer, user or assistant.",
            {"role": role},
        )
    return role


def normalize_content(content: Any) -> Any:
    """Check message content is text or text parts, before the union tries its branches.

    Without this, a bad part would be reported once per union branch, with branch
    names in the location; here the client gets one sentence about the part.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise PydanticCustomError("invalid_content", "Message content must be a string or a list of text parts.")
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
    """Reduce the four OpenAI prompt forms to a string or a list of token ids."""
    if isinstance(prompt, str) or not isinstance(prompt, list):
        return prompt  # non-lists are left to the declared type to accept or refuse
    if not prompt:
        raise PydanticCustomError("invalid_prompt", "The prompt must not be an empty list.")
    if all(_is_int(value) for value in prompt):
        return _checked_token_ids(prompt)
    if len(prompt) > 1 and all(isinstance(value, str | list) for value in prompt):
        raise PydanticCustomError("not_supported", "One prompt per request for now.")
    single = prompt[0]
    if len(prompt) == 1 and isinstance(single, str):
        return single
    if len(prompt) == 1 and isinstance(single, list) and single and all(_is_int(value) for value in single):
        return _checked_token_ids(single)
    raise PydanticCustomError(
        "invalid_prompt", "The prompt must be a string, a list of token ids, or a list holding one of these."
    )


def _is_int(value: Any) -> bool:
    # bool is an int subclass, and `true` is not a token id.
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_token_ids(token_ids: list[int]) -> list[int]:
    if any(token_id < 0 for token_id in token_ids):
        raise PydanticCustomError("invalid_prompt", "Token ids must be non-negative integers.")
    return token_ids


def validate_stop(stop: str | list[str] | None) -> str | list[str] | None:
    """At most four stop sequences, none of them empty (an empty one would stop at once)."""
    sequences = [stop] if isinstance(stop, str) else stop or []
    if len(sequences) > MAX_STOP_SEQUENCES:
        raise PydanticCustomError("too_many_stops", "At most 4 stop sequences are allowed.")
    if any(not sequence for sequence in sequences):
        raise PydanticCustomError("empty_stop", "Stop sequences must not be empty.")
    return stop
