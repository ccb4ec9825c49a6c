"""Owns holding back batch-lane events: their deltas are published merged, not one per step.

Nobody reads a batch line's tokens as they come: the batch runner waits for the
line's terminal event, and a background response is polled. Publishing every
decode step's delta for dozens of batch sequences costs the worker a Lua call
per sequence per step, and Redis and the gateway the same, on the cores the
interactive requests need. So a batch-lane request's events are held until it
ends, or until the oldest has waited ``hold_s``, and then go out with each
choice's deltas merged into one.

``hold_s`` bounds what a takeover repeats: a worker that dies loses at most that
much unpublished output, which the next attempt generates again (nobody saw it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shared.protocol import TERMINAL_EVENT_TYPES, Delta, TokenEvent


@dataclass
class _Held:
    since: float
    events: list[TokenEvent] = field(default_factory=list)


class HeldEvents:
    """Batch-lane events per request, released merged at the request's end or after ``hold_s``."""

    def __init__(self, hold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._hold_s = hold_s
        self._clock = clock
        self._held: dict[str, _Held] = {}

    def take(self, request_id: str, events: Sequence[TokenEvent]) -> list[TokenEvent]:
        """Hold ``events``; what is due to publish now (everything held, once the request ends)."""
        if not events:
            return []
        held = self._held.setdefault(request_id, _Held(self._clock()))
        held.events.extend(events)
        if any(event.type in TERMINAL_EVENT_TYPES for event in events):
            return merged(self._held.pop(request_id).events)
        return []

    def due(self) -> list[tuple[str, TokenEvent]]:
        """The held events of requests whose oldest has waited ``hold_s``, released."""
        now = self._clock()
        expired = [request_id for request_id, held in self._held.items() if now - held.since >= self._hold_s]
        return [
            (request_id, event)
            for request_id in expired
            for event in merged(self._held.pop(request_id).events)
        ]

    def drop(self, request_id: str) -> None:
        """Forget a request's held events (aborted, failed or taken over: nobody needs them)."""
        self._held.pop(request_id, None)


def merged(events: Sequence[TokenEvent]) -> list[TokenEvent]:
    """``events`` with each choice's deltas merged into its first; every other event keeps its place.

    A choice's deltas all come before its ``ChoiceFinished``, so merging into the first
    keeps every choice's order, and the order of events of different choices is free.
    Reasoning is joined like text; tool-call fragments are kept in order (a reader
    assembles a call from its fragments by their ``index``).
    """
    out: list[TokenEvent] = []
    slot_of: dict[int, int] = {}  # choice index -> position of its merged delta in ``out``
    for event in events:
        if not isinstance(event, Delta):
            out.append(event)
            continue
        slot = slot_of.get(event.index)
        if slot is None:
            slot_of[event.index] = len(out)
            out.append(event)
            continue
        first = out[slot]
        assert isinstance(first, Delta)
        out[slot] = first.model_copy(
            update={
                "text": first.text + event.text,
                "reasoning": first.reasoning + event.reasoning,
                "tool_calls": None
                if first.tool_calls is None and event.tool_calls is None
                else (first.tool_calls or []) + (event.tool_calls or []),
                "token_ids": first.token_ids + event.token_ids,
                "logprobs": None
                if first.logprobs is None and event.logprobs is None
                else (first.logprobs or []) + (event.logprobs or []),
            }
        )
    return out
