"""Owns per-sequence logits processing, seeded sampling and token scoring on top of transformers' processors.

Each sequence carries its own processor list and its own ``torch.Generator``, so a
seeded request draws the same tokens whatever else shares the worker. This is the
per-row path: ``batch_sampling.py`` applies the same processors to a whole step's
rows at once and leaves here only the rows it cannot take.

Both paths draw the same way (``draws.py``), so a seeded row draws the same token
whichever path takes it.

Logprobs are scored on the raw logits (log-softmax before penalties, biases and
warpers), as vLLM does by default: they say what the model thinks, whatever the
sampling settings, and greedy's choice is always the top-1 alternative.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TypicalLogitsWarper,
)

from worker.engine import SamplingParams, TokenScore
from worker.engine.draws import draw_tokens, uniform_draws

# How many of a row's most likely tokens top_p looks at before it sorts the whole vocabulary.
NUCLEUS_CANDIDATES = 256


class OpenAIPenaltyProcessor(LogitsProcessor):
    """OpenAI's presence and frequency penalties, counted over generated tokens only."""

    def __init__(self, presence: float, frequency: float, prompt_length: int) -> None:
        self._presence = presence
        self._frequency = frequency
        self._prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self._prompt_length :]
        if generated.shape[1] == 0:
            return scores
        counts = torch.zeros_like(scores).scatter_add_(
            1, generated, torch.ones_like(generated, dtype=scores.dtype)
        )
        penalty = self._frequency * counts + self._presence * (counts > 0).to(scores.dtype)
        return scores - penalty  # type: ignore[return-value]


class LogitBiasProcessor(LogitsProcessor):
    """OpenAI's logit_bias: a fixed value added to chosen tokens' logits before anything else."""

    def __init__(self, biases: tuple[tuple[int, float], ...]) -> None:
        self._tokens = [token for token, _ in biases]
        self._biases = [bias for _, bias in biases]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        bias = torch.tensor(self._biases, dtype=scores.dtype, device=scores.device)
        scores[:, self._tokens] += bias
        return scores


class NucleusWarper(LogitsProcessor):
    """top_p, as ``nucleus`` computes it (transformers' ``TopPLogitsWarper`` sorts the whole vocabulary)."""

    def __init__(self, top_p: float) -> None:
        self._top_p = top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        cutoff = torch.full((scores.shape[0], 1), self._top_p, dtype=scores.dtype, device=scores.device)
        return nucleus(scores, cutoff)  # type: ignore[return-value]


def nucleus(scores: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``scores`` ([rows, vocab]) with every token outside its row's nucleus at -inf; ``top_p`` is [rows, 1].

    transformers' rule: a token stays when the tokens more likely than it hold less than top_p,
    and the most likely always stays. It is applied to the ``NUCLEUS_CANDIDATES`` most likely
    tokens, a partial sort, for the rows whose candidates hold top_p; the others sort their whole
    vocabulary (32 rows at 49,152 tokens on one core: 5 ms against 116 ms). Intentional divergence:
    transformers sums the probabilities from the least likely up, this sums from the most likely
    down, so a token whose mass above lies within float rounding of top_p may fall on the other side.
    """
    probabilities = scores.softmax(dim=-1)
    kept, covered = _nucleus_among(probabilities, top_p, min(NUCLEUS_CANDIDATES, scores.shape[-1]))
    if not bool(covered.all()):
        rows = (~covered).nonzero().squeeze(1)
        kept[rows] = _nucleus_among(probabilities[rows], top_p[rows], scores.shape[-1])[0]
    return scores.masked_fill(~kept, -math.inf)


def _nucleus_among(
    probabilities: torch.Tensor, top_p: torch.Tensor, candidates: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which tokens stay, judged among each row's ``candidates`` most likely; whether that was enough."""
    top, order = probabilities.topk(candidates, dim=-1)
    cumulative = top.cumsum(dim=-1)
    stays = (cumulative - top) < top_p
    stays[:, 0] = True
    kept = torch.zeros_like(probabilities, dtype=torch.bool).scatter_(1, order, stays)
    # Enough when the candidates hold top_p: every token past them has at least that much above it.
    return kept, cumulative[:, -1] >= top_p.squeeze(1)


def build_processors(
    params: SamplingParams, prompt_length: int, eos_token_ids: frozenset[int]
) -> LogitsProcessorList:
    """Penalties first (they shape the distribution), then warpers when sampling."""
    processors = LogitsProcessorList()
    if params.logit_bias:
        processors.append(LogitBiasProcessor(params.logit_bias))
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.presence_penalty or params.frequency_penalty:
        processors.append(
            OpenAIPenaltyProcessor(params.presence_penalty, params.frequency_penalty, prompt_length)
        )
    if params.no_repeat_ngram_size > 0:
        processors.append(NoRepeatNGramLogitsProcessor(params.no_repeat_ngram_size))
    if params.min_new_tokens > 0 and eos_token_ids:
        processors.append(
            MinNewTokensLengthLogitsProcessor(prompt_length, params.min_new_tokens, sorted(eos_token_ids))
        )
    if not params.is_greedy:
        processors.extend(_warpers(params))
    return processors


def _warpers(params: SamplingParams) -> list[LogitsProcessor]:
    warpers: list[LogitsProcessor] = [TemperatureLogitsWarper(params.temperature)]
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(NucleusWarper(params.top_p))
    if params.typical_p < 1.0:
        warpers.append(TypicalLogitsWarper(params.typical_p))
    if params.min_p > 0.0:
        warpers.append(MinPLogitsWarper(params.min_p))
    return warpers


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A private RNG per sampled sequence; unseeded requests get a fresh random seed."""
    if params.is_greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
    return generator


def choose_token(
    logits: torch.Tensor,
    input_ids: torch.LongTensor,
    processors: LogitsProcessorList,
    generator: torch.Generator | None,
) -> int:
    """Pick the next token from the last position's logits (shape [1, vocab])."""
    scores = processors(input_ids, logits.float())
    if generator is None:
        return int(scores.argmax(dim=-1).item())
    probabilities = torch.softmax(scores, dim=-1)
    tokens, valid = draw_tokens(probabilities, uniform_draws([generator], probabilities.device))
    if not bool(valid[0]):
        raise ValueError("the sampling distribution has no finite, positive mass")
    return int(tokens[0].item())


def score_tokens(logits: torch.Tensor, chosen: Sequence[int], top: int) -> list[TokenScore]:
    """Score ``chosen[i]`` under row i of raw ``logits`` ([rows, vocab]), with ``top`` alternatives.

    The top-k costs a partial sort of the vocabulary per row, so it runs only when asked.
    """
    if not chosen:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen_ids = torch.tensor(list(chosen), device=logits.device).unsqueeze(1)
    chosen_logprobs = logprobs.gather(1, chosen_ids).squeeze(1).tolist()
    alternatives: list[tuple[tuple[int, float], ...]] = [()] * len(chosen)
    if top > 0:
        values, ids = logprobs.topk(top, dim=-1)
        alternatives = [
            tuple(zip(row_ids, row_values, strict=True))
            for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)
        ]
    return [
        TokenScore(token, logprob, top_k)
        for token, logprob, top_k in zip(chosen, chosen_logprobs, alternatives, strict=True)
    ]


def trim_score(score: TokenScore, top: int) -> TokenScore:
    """``score`` with at most ``top`` alternatives (rows scored together share the largest k)."""
    return score if len(score.top) <= top else TokenScore(score.token_id, score.logprob, score.top[:top])
