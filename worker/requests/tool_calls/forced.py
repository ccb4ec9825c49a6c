"""Owns reading calls out of an output the engine constrained to them (``tool_choice`` required or named).

The text *is* the calls (``shared/structured/tools.py`` built the grammar), so none
of it is content:

* named: the text is the function's arguments object, streamed as the call's
  ``arguments`` fragments as it comes (the first fragment carries id and name);
* required: the text is a JSON list ``[{"name": ..., "arguments": {...}}, ...]``; each
  call goes out whole once its object has closed.

What a truncated output (``length``) leaves unfinished is not a call and is dropped.
"""

from __future__ import annotations

import json

from shared.protocol import ToolCallDelta
from worker.requests.tool_calls.formats import call_of
from worker.requests.tool_calls.ids import CallIds
from worker.requests.tool_calls.scanner import CallsParsed

_DECODER = json.JSONDecoder()


class NamedCall:
    """The output as the arguments of one call of ``name``."""

    def __init__(self, name: str, ids: CallIds) -> None:
        self._name = name
        self._ids = ids
        self.has_calls = False

    def feed(self, text: str) -> CallsParsed:
        if not text:
            return CallsParsed()
        if self.has_calls:
            return CallsParsed(calls=[ToolCallDelta(index=0, arguments=text)])
        self.has_calls = True
        first = ToolCallDelta(index=0, id=self._ids.of(0), name=self._name, arguments=text)
        return CallsParsed(calls=[first])

    def finish(self) -> CallsParsed:
        return CallsParsed()


class RequiredCalls:
    """The output as a JSON list of calls, each released once its object is complete."""

    def __init__(self, ids: CallIds) -> None:
        self._ids = ids
        self._text = ""
        self._position = 0  # where the next item (or the list's end) starts
        self._calls = 0

    @property
    def has_calls(self) -> bool:
        return self._calls > 0

    def feed(self, text: str) -> CallsParsed:
        self._text += text
        calls: list[ToolCallDelta] = []
        while (call := self._next_call()) is not None:
            calls.append(call)
        return CallsParsed(calls=calls)

    def finish(self) -> CallsParsed:
        return CallsParsed()

    def _next_call(self) -> ToolCallDelta | None:
        start = self._skip_to_item()
        if start is None:
            return None
        try:
            value, end = _DECODER.raw_decode(self._text, start)
        except ValueError:
            return None  # the object is not complete yet
        self._position = end
        parsed = call_of(value)
        if parsed is None:
            return None
        delta = ToolCallDelta(index=self._calls, id=self._ids.of(self._calls), name=parsed.name,
                              arguments=parsed.arguments)  # fmt: skip
        self._calls += 1
        return delta

    def _skip_to_item(self) -> int | None:
        """The start of the next object in the list, or None when none has begun."""
        position = self._position
        while position < len(self._text) and self._text[position] in " \t\r\n[,":
            position += 1
        self._position = position
        if position < len(self._text) and self._text[position] == "{":
            return position
        return None
