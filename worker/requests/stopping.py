"""Owns stop sequences: finding them in streamed text and holding back what might start one.

Text reaches the matcher piece by piece (one detokenized step at a time), so a stop
sequence can be split across pieces: ``"###"`` may arrive as ``"#"`` then ``"##"``.
The matcher therefore never releases the longest suffix of the unreleased text
that is a proper prefix of some stop sequence. That held tail is either completed
into a match by later text (and trimmed with it) or released once it can no longer
be one (or by ``flush`` at the end of generation).

Memory is linear in the stop sequences' lengths (a stop may be thousands of
characters long): each stop keeps its KMP failure function, an array of one int
per character, and the matcher keeps, per stop, how many of its leading characters
the text so far ends with (the KMP automaton's state). Feeding advances every state
one character at a time, amortized constant time per character and stop. The held
tail is then the longest of those states, and a stop matches when its state
reaches its full length. Keeping every prefix in a set instead cost memory growing
with the square of the length.

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

from array import array
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


class _StopAutomaton:
    """One stop sequence and its KMP failure function: how far a match survives a mismatch."""

    __slots__ = ("_failure", "length", "stop")

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.length = len(stop)
        # failure[i]: length of the longest proper prefix of stop[: i + 1] that is also its suffix.
        self._failure = array("i", bytes(4 * len(stop)))
        matched = 0
        for index in range(1, len(stop)):
            while matched and stop[index] != stop[matched]:
                matched = self._failure[matched - 1]
            if stop[index] == stop[matched]:
                matched += 1
            self._failure[index] = matched

    def advance(self, state: int, char: str) -> int:
        """The state after ``char`` from ``state`` (< length): how much of the stop the text ends with."""
        while state and self.stop[state] != char:
            state = self._failure[state - 1]
        return state + 1 if self.stop[state] == char else state


class StopMatcher:
    """Stateful, per-sequence: feed it each new piece of text in order."""

    __slots__ = ("_automata", "_held", "_is_stopped", "_states")

    def __init__(self, stop_sequences: Sequence[str]) -> None:
        stops = dict.fromkeys(s for s in stop_sequences if s)
        self._automata: tuple[_StopAutomaton, ...] = tuple(_StopAutomaton(stop) for stop in stops)
        # Per stop: how many of its leading characters the text so far ends with.
        self._states: list[int] = [0] * len(self._automata)
        self._held = ""
        self._is_stopped = False

    @property
    def is_stopped(self) -> bool:
        return self._is_stopped

    def feed(self, text: str) -> StopResult:
        """Add generated text; return what can be released and the stop sequence if one completed."""
        if self._is_stopped:
            return _NOTHING
        if not self._automata:
            return StopResult(text)
        pending = self._held + text
        # end: where in ``pending`` a stop completed by this character ends.
        for end, char in enumerate(text, start=len(self._held) + 1):
            stop = self._advance(char)
            if stop is not None:
                self._held = ""
                self._is_stopped = True
                return StopResult(pending[: end - len(stop)], stop)
        hold = max(self._states)
        self._held = pending[len(pending) - hold :]
        return StopResult(pending[: len(pending) - hold])

    def flush(self) -> str:
        """Release the held tail at the end of generation (it never became a stop sequence)."""
        released, self._held = self._held, ""
        self._states = [0] * len(self._automata)
        return released

    def _advance(self, char: str) -> str | None:
        """Step every stop's state over ``char``; the longest stop it completes, if any.

        Checking after each character is what makes the earliest-ending stop win;
        among stops completed by the same character, the longest starts earliest.
        """
        completed: _StopAutomaton | None = None
        for index, automaton in enumerate(self._automata):
            state = automaton.advance(self._states[index], char)
            self._states[index] = state
            if state == automaton.length and (completed is None or state > completed.length):
                completed = automaton
        return None if completed is None else completed.stop
