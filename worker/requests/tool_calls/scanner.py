"""Owns finding tool calls in a streamed output (``tool_choice: auto``): content goes out, calls are parsed.

Two states. In content, text is released at once, except a tail that may begin a
call marker (held back until known, ``markers.py``) and separators where a call may
follow (whitespace between calls belongs to no content). In a call block, text is
held until the block is complete (its end marker, or its JSON value closed), then
parsed: its calls go out whole (id, name and all the arguments in one fragment,
which OpenAI's streaming shape allows), or, when it does not parse, its text goes
out as content, exactly as the model wrote it: a malformed call is never an error.

With parallel calls off (``parallel_tool_calls: false``) only the first call counts;
the model's further calls are dropped, neither calls nor content.

A block still open when the output ends (EOS right after the JSON, or a stop
sequence that cut the end marker) counts if its body parses, else it is content.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.protocol import ToolCallDelta
from worker.requests.markers import Found, NotFound, find_marker
from worker.requests.tool_calls.formats import CallFormat, ParsedCall
from worker.requests.tool_calls.ids import CallIds


@dataclass(frozen=True, slots=True)
class CallsParsed:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


class CallScanner:
    """Stateful, per choice: feed it each new piece of content in order."""

    def __init__(self, call_format: CallFormat, ids: CallIds, *, max_calls: int | None = None) -> None:
        self._format = call_format
        self._ids = ids
        self._max_calls = max_calls  # parallel_tool_calls false: 1, and later calls are dropped
        self._held = ""  # content state: held tail; block state: the block's body so far
        self._marker: str | None = None  # the open block's start marker ("" for a bare JSON block)
        self._at_boundary = True  # where a call may begin without a marker (start, after a call)
        self._calls = 0

    @property
    def has_calls(self) -> bool:
        return self._calls > 0

    def feed(self, text: str) -> CallsParsed:
        pending, self._held = self._held + text, ""
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while pending:
            if self._marker is None:
                pending = self._scan_content(pending, content)
            else:
                pending = self._scan_block(pending, content, calls)
        return CallsParsed("".join(content), calls)

    def finish(self) -> CallsParsed:
        """Settle what is held: an open block parses or is content; separators after calls go."""
        held, self._held = self._held, ""
        if self._marker is None:
            dropped = self.has_calls and not held.strip(self._format.separators)
            return CallsParsed("" if dropped else held)
        marker, self._marker = self._marker, None
        parsed = self._format.parse(held)
        if parsed is None:
            return CallsParsed(marker + held)
        return CallsParsed(calls=self._deltas(parsed))

    def _scan_content(self, pending: str, content: list[str]) -> str:
        """Release content up to the next block; returns the text left to scan (in a block)."""
        if self._at_boundary:
            pending = self._past_boundary(pending)
            if not pending or self._marker is not None:
                return pending
        found = find_marker(pending, self._format.starts)
        if isinstance(found, NotFound):
            content.append(found.released)
            self._held = found.held
            return ""
        content.append(found.before)
        self._marker = found.marker
        return found.after

    def _past_boundary(self, pending: str) -> str:
        """Where a call may begin: separators before a call (or after the last) are no content."""
        body = pending.lstrip(self._format.separators)
        if self._format.json_opens and body.startswith("{"):
            self._marker = ""  # a bare JSON block
            return body
        found = find_marker(body, self._format.starts)
        if not body or (isinstance(found, NotFound) and not found.released):
            self._held = pending  # nothing but separators and maybe a marker's start: wait
            return ""
        self._at_boundary = False
        is_call_next = isinstance(found, Found) and not found.before
        return body if is_call_next or self.has_calls else pending

    def _scan_block(self, pending: str, content: list[str], calls: list[ToolCallDelta]) -> str:
        """Complete the open block if ``pending`` does; returns the text after it."""
        end = self._format.block_end(pending)
        if end is None:
            self._held = pending
            return ""
        body_end, block_end = end
        marker, self._marker = self._marker or "", None
        parsed = self._format.parse(pending[:body_end])
        if parsed is None:
            content.append(marker + pending[:block_end])
        else:
            calls += self._deltas(parsed)
            self._at_boundary = True
        return pending[block_end:]

    def _deltas(self, parsed: list[ParsedCall]) -> list[ToolCallDelta]:
        deltas = []
        if self._max_calls is not None:
            parsed = parsed[: max(0, self._max_calls - self._calls)]
        for call in parsed:
            deltas.append(ToolCallDelta(index=self._calls, id=self._ids.of(self._calls), name=call.name,
                                        arguments=call.arguments))  # fmt: skip
            self._calls += 1
        return deltas
