"""Owns the tool-call formats models write: where a call block starts and ends, and what it holds.

* ``hermes`` (Qwen2.5, Hermes 2/3, and our fallback template): ``<tool_call>\\n{"name":
  ..., "arguments": {...}}\\n</tool_call>``, one block per call;
* ``llama3_json`` (Llama 3.1+ with JSON tool calling): the output itself is a JSON object
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several
  separated by ``;``;
* ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` objects (or,
  from tokenizer v11 on, ``[TOOL_CALLS]name[ARGS]{...}`` per call).

Every format accepts ``arguments`` or ``parameters``, given as an object or as JSON
text. A block that does not parse into calls is not an error: the parser gives its
text back as content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

ToolParserName = Literal["hermes", "llama3_json", "mistral"]

_DECODER = json.JSONDecoder()
ARGS_MARKER = "[ARGS]"


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class CallFormat:
    """How one family writes calls.

    ``starts``: markers opening a call block; ``end``: the marker closing it (None: the
    block is complete once its JSON is); ``json_opens``: a JSON object where a call may
    begin (the output's start, right after a call) is a call block without a marker;
    ``separators``: characters between and around calls that belong to no content.
    """

    name: ToolParserName
    starts: tuple[str, ...]
    end: str | None
    json_opens: bool = False
    separators: str = " \t\r\n"

    def block_end(self, body: str) -> tuple[int, int] | None:
        """Where a block's body ends and where the block ends, once it is complete."""
        if self.end is not None:
            at = body.find(self.end)
            return None if at < 0 else (at, at + len(self.end))
        end = json_end(body)
        return None if end is None else (end, end)

    def parse(self, body: str) -> list[ParsedCall] | None:
        """The calls in a block's body; None when it holds something else."""
        if self.name == "mistral" and ARGS_MARKER in body and not body.lstrip().startswith(("[", "{")):
            name, _, arguments = body.partition(ARGS_MARKER)
            return calls_of({"name": name.strip(), "arguments": _json_value(arguments)})
        return calls_of(_json_value(body))


HERMES = CallFormat("hermes", ("<tool_call>",), "</tool_call>")
LLAMA3_JSON = CallFormat("llama3_json", ("<|python_tag|>",), None, json_opens=True, separators=" \t\r\n;")
MISTRAL = CallFormat("mistral", ("[TOOL_CALLS]",), None)
FORMATS: dict[ToolParserName, CallFormat] = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL)}


def json_end(text: str) -> int | None:
    """Where the JSON value at the start of ``text`` (after whitespace, or a v11 ``name[ARGS]``) ends."""
    start = len(text) - len(text.lstrip())
    if not text[start:].startswith(("{", "[")):
        at = text.find(ARGS_MARKER)
        if at < 0:
            return None
        start = at + len(ARGS_MARKER)
        start += len(text[start:]) - len(text[start:].lstrip())
    # Only a closing bracket can complete a value: skip decoding (quadratic over a long
    # call) for every piece that does not end with one.
    if not text.rstrip().endswith(("}", "]")):
        return None
    try:
        _, end = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    return int(end)


def calls_of(value: Any) -> list[ParsedCall] | None:
    """A call object, or a non-empty list of them, as calls; None for anything else."""
    items = value if isinstance(value, list) else [value]
    calls = [call_of(item) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def call_of(value: Any) -> ParsedCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _json_value(arguments)  # JSON text: keep it only if it is an object
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))


class _NotJson:
    """What text that is no JSON value parses to (None is JSON's null)."""


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _NotJson()
