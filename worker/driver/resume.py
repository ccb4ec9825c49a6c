"""Owns reading a request's stream back to find where a taken-over request resumes.

The stream is the source of truth: a client has seen exactly what is in it. Every
``Delta`` carries the ids of all tokens generated since the previous delta of its
choice, so the stream's deltas hold a complete prefix of each choice's tokens.
Tokens the dead worker generated but never published are simply generated again
(for a greedy request, identically). The resuming worker prefills prompt plus
that prefix and replays the prefix through a fresh ``RequestOutput``, which then
knows exactly how much text the client already has (``RequestOutput.replay``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.protocol import TERMINAL_EVENT_TYPES, Accepted, ChoiceFinished, Delta, TokenEvent


@dataclass
class ChoiceProgress:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    is_finished: bool = False


@dataclass
class StreamProgress:
    choices: dict[int, ChoiceProgress] = field(default_factory=dict)
    is_over: bool = False  # the terminal event is stored: nothing to resume
    is_accepted: bool = False  # ``Accepted`` is stored (an attempt may die between its claim and it)

    def choice(self, index: int) -> ChoiceProgress:
        return self.choices.setdefault(index, ChoiceProgress())


def progress_of(events: Iterable[TokenEvent]) -> StreamProgress:
    """Each choice's published tokens and text, and whether the request already ended."""
    progress = StreamProgress()
    for event in events:
        if isinstance(event, Delta):
            choice = progress.choice(event.index)
            choice.token_ids.extend(event.token_ids)
            choice.text += event.text
        elif isinstance(event, ChoiceFinished):
            progress.choice(event.index).is_finished = True
        elif isinstance(event, Accepted):
            progress.is_accepted = True
        elif event.type in TERMINAL_EVENT_TYPES:
            progress.is_over = True
    return progress
