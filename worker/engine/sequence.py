"""Owns one sequence's state in the batched engine: request, sampling state, tokens, prefill progress.

A constrained sequence carries its own grammar matcher, behind a gate that keeps it
dormant while a reasoning model thinks (``reasoning_gate.py``): it consumes every accepted
token once awake, and the sequence ends with ``stop`` as soon as the grammar is complete (the
matcher allows nothing more), even under ignore_eos and before min_tokens, which
could otherwise only wait on an EOS the grammar no longer allows. A cut by
max_tokens stays ``length``: the output is then incomplete, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache, LogitsProcessorList

from shared.protocol import FinishReason
from worker.engine import EngineRequest, SequenceUpdate, TokenScore, output_start
from worker.engine.reasoning_gate import ReasoningGate
from worker.engine.sampling import build_processors, make_generator, score_tokens


@dataclass
class Sequence:
    request: EngineRequest
    processors: LogitsProcessorList
    generator: torch.Generator | None
    token_ids: list[int]
    generated: int = 0
    prefilled: int = 0
    prefill_cache: DynamicCache | None = field(default=None, repr=False)
    prompt_scores: list[TokenScore] = field(default_factory=list, repr=False)
    gate: ReasoningGate | None = field(default=None, repr=False)
    admitted: int = 0  # admission order in the engine (preemption frees the newest first)

    @classmethod
    def start(
        cls,
        request: EngineRequest,
        device: torch.device,
        generator: torch.Generator | None = None,
        admitted: int = 0,
    ) -> Sequence:
        """A sequence about to be prefilled, with its own processors and generator (``generator``: a
        preempted run's, to go on drawing where it stopped)."""
        return cls(
            request=request,
            processors=build_processors(request.sampling, output_start(request), request.eos_token_ids),
            generator=generator if generator is not None else make_generator(request.sampling, device),
            token_ids=list(request.prompt_token_ids),
            generated=request.resumed_tokens,
            gate=_start_gate(request),
            admitted=admitted,
        )

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def needs_context(self) -> bool:
        """Whether sampling must see the token history (penalties, n-grams, min length)."""
        return len(self.processors) > 0

    @property
    def wants_prompt_scores(self) -> bool:
        return self.request.prompt_logprobs is not None

    def accept(self, token: int, score: TokenScore | None) -> SequenceUpdate:
        is_first = self.generated == 0
        self.token_ids.append(token)
        self.generated += 1
        if self.gate is not None and not self.gate.consume(token):
            raise GrammarViolation(f"token {token} breaks the grammar: {self.gate.matcher.get_error()[:300]}")
        reason = None
        if token in self.request.eos_token_ids or (self.gate is not None and self.gate.is_stopped()):
            reason = FinishReason.STOP
        elif self.generated >= self.request.max_new_tokens:
            reason = FinishReason.LENGTH
        prompt_logprobs = (None, *self.prompt_scores) if is_first and self.wants_prompt_scores else None
        return SequenceUpdate(
            self.request_id,
            (token,),
            reason,
            logprobs=None if score is None else (score,),
            prompt_logprobs=prompt_logprobs,
        )

    def score_prompt(self, logits: torch.Tensor, start: int) -> list[TokenScore]:
        """Scores of the prompt tokens ``logits`` (positions ``start``..) predict; the caller keeps them."""
        prompt = self.request.prompt_token_ids
        targets = prompt[start + 1 : start + 1 + logits.shape[0]]
        return score_tokens(logits[: len(targets)], targets, self.request.prompt_logprobs or 0)


def resumption_of(sequence: Sequence) -> EngineRequest:
    """The request that goes on where ``sequence`` stopped: its tokens so far as the prompt, the
    generated ones counted as output (``resumed_tokens``), the prompt's logprobs already sent."""
    request = sequence.request
    new = len(sequence.token_ids) - len(request.prompt_token_ids)
    return replace(
        request,
        prompt_token_ids=tuple(sequence.token_ids),
        resumed_tokens=request.resumed_tokens + new,
        prompt_logprobs=None if sequence.generated else request.prompt_logprobs,
    )


class GrammarViolation(RuntimeError):
    """A constrained sequence's token the grammar refuses: a bug, never the client's doing."""


def _start_gate(request: EngineRequest) -> ReasoningGate | None:
    """The request's gated matcher, having taken what an earlier run of it generated (a takeover).

    The resumed tokens go through the gate, not straight to the matcher: a run that died
    mid-thinking resumes dormant, one that died mid-answer resumes with the answer's tokens consumed.
    """
    if request.grammar is None:
        return None
    gate = ReasoningGate(request.grammar.matcher(), request.thinking)
    if request.resumed_tokens and not gate.consume_all(
        list(request.prompt_token_ids[output_start(request) :])
    ):
        raise GrammarViolation(f"the resumed tokens break the grammar: {gate.matcher.get_error()[:300]}")
    return gate
