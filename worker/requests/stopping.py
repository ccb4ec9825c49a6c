"""Owns stop sequences: finding them in streamed text and holding back what might start one.

Text reaches the matcher piece by piece (one detokenized step at a time), so a stop
sequence can be split across pieces: ``"###"`` may arrive as ``"#"`` then ``"##"``.
The matcher therefore never releases the longest suffix of the unreleased text
that is a proper prefix of some stop sequence. That held tail is either completed
into a match by later text (and trimmed with it) or released once it can no longer
be one (or by ``flush`` at the end of generation).

Each ``feed`` scans only the held tail plus the new text. That is enough: a match
that started before the held tail would mean a longer suffix was a prefix of a
stop sequence, and the held tail is by construction the longest one.

Which stop wins when several match: the one that *ends* first, as if the text had
been generated one character at a time and generation halted at the first complete
stop sequence; among those ending at the same place, the longest (it starts
earliest, so less text is released). This makes the result independent of how the
text was split into pieces, which "earliest start" alone would not be: with stops
``["bcd", "abcdef"]`` a stream stops at ``"abcd"`` before ``"abcdef"`` could ever
complete. When stop sequences do not overlap, the rule is simply "first match".

Empty strings in the stop list are ignored (they would match before any text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopResult:
    """What may be sent to the client now, and the stop sequence that ended the text, if one did."""

    text: str
    stop_sequence: str | None = None

    @property
    def is_stopped(self) -> bool:
        return self.stop_sequence is not None


_NOTHING = StopResult("")


class StopMatcher:
    """Stateful, per-sequence: feed it each new piece of text in order."""

    __slots__ = ("_held", "_is_stopped", "_max_prefix_length", "_prefixes", "_stops")

    def __init__(self, stop_sequences: Sequence[str]) -> None:
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stop_sequences if s))
        # Every proper prefix of every stop: the hold-back test is then a set lookup per length.
        self._prefixes: frozenset[str] = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._max_prefix_length = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self._is_stopped = False

    @property
    def is_stopped(self) -> bool:
        return self._is_stopped

    def feed(self, text: str) -> StopResult:
        """Add generated text; return what can be released and the stop sequence if one completed."""
        if self._is_stopped:
            return _NOTHING
        if not self._stops:
            return StopResult(text)
        pending = self._held + text
        match = self._find_first_stop(pending)
        if match is not None:
            start, stop = match
            self._held = ""
            self._is_stopped = True
            return StopResult(pending[:start], stop)
        hold = self._held_length(pending)
        self._held = pending[len(pending) - hold :]
        return StopResult(pending[: len(pending) - hold])

    def flush(self) -> str:
        """Release the held tail at the end of generation (it never became a stop sequence)."""
        released, self._held = self._held, ""
        return released

    def _find_first_stop(self, text: str) -> tuple[int, str] | None:
        """Earliest-ending match in ``text`` (longest on ties), as (start index, stop sequence)."""
        best: tuple[int, int, str] | None = None  # (end, -length, stop) sorts the way we choose
        for stop in self._stops:
            start = text.find(stop)
            if start < 0:
                continue
            candidate = (start + len(stop), -len(stop), stop)
            if best is None or candidate < best:
                best = candidate
        if best is None:
            return None
        end, _, stop = best
        return end - len(stop), stop

    def _held_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop sequence."""
        for length in range(min(len(text), self._max_prefix_length), 0, -1):
            if text[-length:] in self._prefixes:
                return length
        return 0
