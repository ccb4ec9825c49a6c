"""Owns finding a marker (``<think>``, ``<tool_call>``) in text that arrives piece by piece.

A marker may be split across pieces (``"<too"`` then ``"l_call>"``), so text that
might be the start of one is held back, as the stop matcher holds back the start
of a stop sequence (``stopping.py``), and released as soon as it cannot be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Found:
    """Text before the earliest marker, the marker, and the text after it."""

    before: str
    marker: str
    after: str


@dataclass(frozen=True, slots=True)
class NotFound:
    """What may be released, and the tail held back because it may begin a marker."""

    released: str
    held: str


def partial_marker_length(text: str, markers: Sequence[str]) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of some marker."""
    longest = 0
    for marker in markers:
        for length in range(min(len(text), len(marker) - 1), longest, -1):
            if text.endswith(marker[:length]):
                longest = length
                break
    return longest


def find_marker(text: str, markers: Sequence[str]) -> Found | NotFound:
    """Split ``text`` at its earliest marker, or hold back a tail that may begin one."""
    earliest: Found | None = None
    for marker in markers:
        at = text.find(marker)
        if at >= 0 and (earliest is None or at < len(earliest.before)):
            earliest = Found(text[:at], marker, text[at + len(marker) :])
    if earliest is not None:
        return earliest
    held = partial_marker_length(text, markers)
    return NotFound(text[: len(text) - held], text[len(text) - held :])
