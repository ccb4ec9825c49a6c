"""Owns one sequence's state in the batched engine: request, sampling state, tokens, prefill progress."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, LogitsProcessorList

from shared.protocol import FinishReason
from worker.engine import EngineRequest, SequenceUpdate, TokenScore, output_start
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

    @classmethod
    def start(cls, request: EngineRequest, device: torch.device) -> Sequence:
        """A sequence about to be prefilled, with its own processors and generator."""
        return cls(
            request=request,
            processors=build_processors(request.sampling, output_start(request), request.eos_token_ids),
            generator=make_generator(request.sampling, device),
            token_ids=list(request.prompt_token_ids),
            generated=request.resumed_tokens,
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
        reason = None
        if token in self.request.eos_token_ids:
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
