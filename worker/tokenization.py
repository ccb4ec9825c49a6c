"""Owns text <-> tokens for the worker: the tokenizer interface, chat templates, incremental detokenization."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from shared.protocol import ChatMessage


class Tokenizer(Protocol):
    """What the driver needs from a tokenizer; the transformers one and the fake's both fit."""

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Decode without special tokens (what a client should see)."""
        ...

    def render_chat(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool) -> str:
        """Apply the chat template; raises ``shared.errors.InvalidRequest`` on bad template input."""
        ...
