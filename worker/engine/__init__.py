"""Owns the engine interface: the only engine API the rest of the worker sees.

An engine is synchronous and step-driven (vLLM V1's schedule/execute/update, TGI's
``generate_token``): ``step()`` runs one forward pass for whatever is scheduled and
returns what each sequence produced. Compute stays free of asyncio; the async
``EngineDriver`` owns all I/O and is the only caller, from a single thread.
Engines know token ids only: text, stop sequences and events live in the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from shared.protocol import FinishReason


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Resolved, concrete sampling parameters of one sequence (no None: defaults applied)."""

    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    typical_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    length_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    num_beams: int = 1
    min_new_tokens: int = 0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    max_new_tokens: int
    # Tokens that end the sequence with finish_reason "stop"; empty under ignore_eos.
    eos_token_ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class SequenceUpdate:
    """What one sequence produced in one step; ``finish_reason`` set on its last update."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


class Engine(Protocol):
    def add(self, request: EngineRequest) -> None:
        """Queue a request; it joins the batch at a later ``step``."""

    def abort(self, request_id: str) -> None:
        """Drop a request (unknown ids are ignored); no update is produced for it afterwards."""

    def step(self) -> list[SequenceUpdate]:
        """Run one scheduling iteration (one forward pass) and report each sequence's progress."""

    def has_unfinished(self) -> bool:
        """Whether any added request is still waiting or running."""

    def close(self) -> None:
        """Release model memory."""
