"""Owns the engine interface: the only engine API the rest of the worker sees.

An engine is synchronous and step-driven (vLLM V1's schedule/execute/update, TGI's
``generate_token``): ``step()`` runs one forward pass for whatever is scheduled and
returns what each sequence produced. Compute stays free of asyncio; the async
``EngineDriver`` owns all I/O and is the only caller, from a single thread, unless
the engine sets ``concurrent_admission = True``: then ``add`` and ``abort`` may come
from another thread while ``step`` runs (vLLM's adapter, whose ``step`` waits for a
core in another process; ``worker/driver/admission.py``). Without it, engines need no lock.
Engines know token ids only: text, stop sequences and events live in the driver.

One sequence's failure never fails the batch: a step that cannot run a sequence
(its prompt breaks the forward pass, its sampling raises) reports it with a
``failed`` update and goes on with the others, whose output stays what it would
have been without it. ``step`` raises only for a failure it cannot pin on any
sequence (the whole batch's forward fails, whatever it holds); the driver then
fails every request in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shared.protocol import FinishReason

if TYPE_CHECKING:
    from worker.engine.grammar import CompiledGrammar


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
class ThinkingMarkers:
    """A reasoning model's ``<think>``/``</think>`` as this tokenizer's ids (``reasoning_gate.py``)."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    # deepseek_r1: the prompt opened the thinking; qwen3: only an output opening ``start`` thinks.
    starts_thinking: bool


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    max_new_tokens: int
    # Tokens that end the sequence with finish_reason "stop"; empty under ignore_eos.
    eos_token_ids: frozenset[int]
    # None: no logprobs; 0: the chosen token's only; k: plus the k most likely tokens.
    logprobs: int | None = None
    # The same for every prompt token (needs the prefill's logits at all positions).
    prompt_logprobs: int | None = None
    # How many of ``prompt_token_ids``' last tokens this request generated in an earlier run
    # that died (a takeover) or that the engine preempted: they count as output for max/min
    # tokens and penalties.
    resumed_tokens: int = 0
    # Lower runs first: interactive requests (0) are admitted and prefilled before batch ones (1).
    priority: int = 0
    # What the output must match (structured outputs, a required or named tool call), compiled for
    # this model's vocabulary in the job's preparation; None: free text. Backends that do not
    # enforce grammars are never handed one (``worker/engine/grammar.py``).
    grammar: CompiledGrammar | None = None
    # A reasoning model's markers: the grammar is dormant while it thinks. None: the grammar
    # holds from the first token (no reasoning parser, or the prompt already closed the thinking).
    thinking: ThinkingMarkers | None = None


def output_start(request: EngineRequest) -> int:
    """Where the request's own output begins in its token ids (after the prompt proper)."""
    return len(request.prompt_token_ids) - request.resumed_tokens


@dataclass(frozen=True, slots=True)
class TokenScore:
    """A token's log-probability under the model's raw distribution (log-softmax of the logits,
    before penalties, biases and warpers: vLLM's default), with the top alternatives when asked."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass(frozen=True, slots=True)
class SequenceUpdate:
    """What one sequence produced in one step; ``finish_reason`` set on its last update."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    # The engine could not run this sequence and dropped it (no token, no finish reason).
    failed: bool = False
    # One score per new token, when the request asked for logprobs.
    logprobs: tuple[TokenScore, ...] | None = None
    # On the sequence's first update, when asked: one per prompt token, None for the first.
    prompt_logprobs: tuple[TokenScore | None, ...] | None = None
    # On the sequence's first update, where the engine reports it: prompt tokens its prefix
    # cache served (``usage.prompt_tokens_details.cached_tokens``).
    cached_prompt_tokens: int | None = None

    @property
    def is_finished(self) -> bool:
        """Whether the sequence has left the engine: it finished, or it failed."""
        return self.finish_reason is not None or self.failed


def failed_update(request_id: str) -> SequenceUpdate:
    """The update of a sequence the engine could not run; it is no longer in the engine."""
    return SequenceUpdate(request_id, (), failed=True)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What an engine holds between two steps, for metrics (read on the driver's thread)."""

    running: int  # sequences in the batch, prefilling ones included
    waiting: int  # added, not admitted yet
    kv_reserved_tokens: int = 0  # cache positions the running sequences take from the budget now
    kv_capacity_tokens: int = 0  # the budget they are admitted against; 0: none (no shared cache)
    kv_held_tokens: int = 0  # tokens whose KV the running and prefilling sequences hold
    prefix_cache_tokens: int = 0  # prompt tokens whose KV the prefix cache holds
    prefix_cache_hit_tokens: int = 0  # prompt tokens served from the prefix cache so far (cumulative)
    grammar_mask_seconds: float = 0.0  # time spent filling and applying grammar masks so far (cumulative)
    grammar_mask_fills: int = 0  # batched mask fills so far: one per forward with constrained rows


class Engine(Protocol):
    def add(self, request: EngineRequest) -> None:
        """Queue a request; it joins the batch at a later ``step``."""

    def abort(self, request_id: str) -> None:
        """Drop a request (unknown ids are ignored); no update is produced for it afterwards."""

    def step(self) -> list[SequenceUpdate]:
        """Run one scheduling iteration (one forward pass) and report each sequence's progress.

        A sequence the step cannot run comes back as a ``failed`` update, alone; raises only
        when the failure cannot be pinned on a sequence."""

    def has_unfinished(self) -> bool:
        """Whether any added request is still waiting or running."""

    def stats(self) -> EngineStats:
        """Counts of running and waiting sequences and the cache they reserve; cheap, read-only."""

    def close(self) -> None:
        """Release model memory."""
