"""Owns tool-call ids: deterministic from the request, the choice and the call's place.

A taken-over request replays its output on another worker (``RequestOutput.replay``);
ids drawn at random would change mid-stream, and a client that already holds
``call_…`` from the first worker would get a different one for the same call. A hash
of where the call is keeps them equal, and unique per request, choice and call.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallIds:
    request_id: str
    choice: int = 0

    def of(self, call_index: int) -> str:
        """The id of this choice's ``call_index``-th call (OpenAI's ``call_`` and 24 characters)."""
        key = f"{self.request_id}/{self.choice}/{call_index}".encode()
        return "call_" + hashlib.sha256(key).hexdigest()[:24]
