"""Owns splitting a reasoning model's thinking off its answer: ``<think>...</think>`` becomes reasoning.

Two conventions, named as vLLM's ``--reasoning-parser`` names them:

* ``deepseek_r1``: DeepSeek-R1's template ends the prompt with ``<think>\\n``, so the
  output starts *inside* the thinking, usually without an opening marker (one is
  dropped if the model writes it anyway). Everything up to ``</think>`` is reasoning;
  an output that never closes it is all reasoning.
* ``qwen3``: thinking only where the model opens it with ``<think>``. With
  ``enable_thinking: false`` the template writes an empty thinking block into the
  prompt and the output is all content.

Whitespace right after ``</think>`` (the models write ``</think>\\n\\n``) is dropped
from the content: it separates the two parts and belongs to neither. Markers split
across pieces are held back until known (``markers.py``), so the split does not
depend on how the text was cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Literal

from worker.requests.markers import Found, NotFound, find_marker

ReasoningParserName = Literal["none", "deepseek_r1", "qwen3"]

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True, slots=True)
class Split:
    reasoning: str = ""
    content: str = ""


class _State(Enum):
    OPENING = auto()  # deepseek_r1: inside the thinking, an opening marker may still come first
    BEFORE = auto()  # qwen3: content until a <think> opens
    THINKING = auto()
    ANSWER = auto()  # after </think>: content, leading whitespace dropped
    CONTENT = auto()  # content for good


class ReasoningSplitter:
    """Stateful, per choice: feed it each new piece of text in order."""

    __slots__ = ("_held", "_state")

    def __init__(self, name: Literal["deepseek_r1", "qwen3"]) -> None:
        self._state = _State.OPENING if name == "deepseek_r1" else _State.BEFORE
        self._held = ""

    @property
    def is_thinking(self) -> bool:
        """Whether the text fed so far ends inside the thinking (or may still open it: deepseek_r1)."""
        return self._state in (_State.OPENING, _State.THINKING)

    @property
    def holds_text(self) -> bool:
        """Whether text fed so far is held back (it may be the start of a marker)."""
        return bool(self._held)

    def feed(self, text: str) -> Split:
        pending, self._held = self._held + text, ""
        if self._state is _State.OPENING:
            return self._opening(pending)
        if self._state is _State.BEFORE:
            return self._before(pending)
        if self._state is _State.THINKING:
            return self._thinking(pending)
        if self._state is _State.ANSWER:
            return self._answer(pending)
        return Split(content=pending)

    def finish(self) -> Split:
        """What is still held once the output ended: partial markers were text after all."""
        held, self._held = self._held, ""
        if self._state in (_State.OPENING, _State.THINKING):
            return Split(reasoning=held)
        return Split(content=held)

    def _opening(self, pending: str) -> Split:
        stripped = pending.lstrip()
        if stripped.startswith(THINK_START):
            self._state = _State.THINKING
            return self._thinking(stripped[len(THINK_START) :])
        if THINK_START.startswith(stripped):
            self._held = pending  # still may be the opening marker
            return Split()
        self._state = _State.THINKING
        return self._thinking(pending)

    def _before(self, pending: str) -> Split:
        found = find_marker(pending, (THINK_START,))
        if isinstance(found, NotFound):
            self._held = found.held
            return Split(content=found.released)
        self._state = _State.THINKING
        return _joined(Split(content=found.before), self._thinking(found.after))

    def _thinking(self, pending: str) -> Split:
        found = find_marker(pending, (THINK_END,))
        if isinstance(found, Found):
            self._state = _State.ANSWER
            return _joined(Split(reasoning=found.before), self._answer(found.after))
        self._held = found.held
        return Split(reasoning=found.released)

    def _answer(self, pending: str) -> Split:
        content = pending.lstrip()
        if content:
            self._state = _State.CONTENT
        return Split(content=content)


def _joined(first: Split, second: Split) -> Split:
    return Split(first.reasoning + second.reasoning, first.content + second.content)
