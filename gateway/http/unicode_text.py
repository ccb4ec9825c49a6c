"""Owns the check that a JSON request body holds only text UTF-8 can carry: no lone surrogates.

JSON may spell half of a UTF-16 surrogate pair on its own (``"\\ud800"``). Python's
``json`` accepts it into a ``str`` that cannot be encoded as UTF-8, so it would only
fail far away, in the worker's tokenizer, where the client would wait for an answer
that never comes. It is the same mistake as invalid UTF-8 bytes and gets the same
400, naming the parameter that holds it. Pairs that form one character (what
``json.dumps`` writes for an emoji) are fine: ``json`` joins them.
"""

from __future__ import annotations

import json
from typing import Any

from shared.errors import InvalidRequest


def check_unicode_text(body: bytes) -> None:
    """Raise InvalidRequest when any key or string in the JSON ``body`` holds a lone surrogate."""
    try:
        document = json.loads(body)
    except ValueError:
        return  # not JSON at all: body validation reports that, with its position
    path = lone_surrogate_path(document)
    if path is not None:
        raise InvalidRequest(
            "The request body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not "
            "valid Unicode text.",
            param=".".join(path) or None,
        )


def lone_surrogate_path(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The location of the first string (or key) with a lone surrogate in ``value``, if any."""
    if isinstance(value, str):
        return None if _is_encodable(value) else path
    if isinstance(value, list):
        items: list[tuple[str, Any]] = [(str(index), item) for index, item in enumerate(value)]
    elif isinstance(value, dict):
        items = list(value.items())
    else:
        return None
    for key, item in items:
        found = path + (key,) if not _is_encodable(key) else lone_surrogate_path(item, path + (key,))
        if found is not None:
            return found
    return None


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
