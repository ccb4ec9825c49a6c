"""Owns sampling a step's rows together: each row's parameters as tensors, a few operations per batch.

The per-row path (``sampling.build_processors``, one transformers processor list per
row) costs a ``[1, vocab]`` operation per parameter per row plus its Python, every
step. Here the step's ``[rows, vocab]`` logits go through each parameter once, with
per-row values as columns of tensors; an all-greedy batch without processors is one
``argmax`` over float32 logits (on CPU, an argmax over bfloat16 logits costs 4 times
as much as converting them first), taken in blocks (``greedy_tokens``). Measured for
32 rows at 49,152 tokens on one core, per step, before the blocks: greedy 5.6 -> 1.5
ms; temperature 42 -> 1.7 ms; temperature, top_k and the three penalties 57 -> 11 ms;
the same with top_p instead of top_k 155 -> 19 ms.

Semantics are ``build_processors``' to the bit on CPU: the same order (logit_bias,
repetition penalty over prompt and output, presence/frequency over output only,
EOS held back until min_new_tokens; then, for sampled rows only, temperature,
top_k, top_p, min_p), the same float32 operations, the same top_p rule
(``sampling.nucleus``), so a row's token does not depend on which path took it nor
on what shares its batch. (On CUDA, a division by a Python scalar may round
differently from one by a tensor: there the two paths agree within float rounding.)
A parameter left at its neutral value costs nothing: it is applied to the rows that
set it only, and the penalties touch only the tokens a row has seen, counted across
steps (``token_counts.py``). Two edge notes: min_p's "keep the most likely token" is
implied (min_p <= 1), and top_k past the vocabulary keeps everything, as
transformers' clamp does.

Left to the per-row path (``isolation.py``), each row for itself only: rows needing
a processor this module does not have (no_repeat_ngram_size, typical_p), rows whose
parameters cannot apply (a bias on an id past the logits), and rows whose
distribution has no finite, positive mass, where the per-row path raises and fails
the row alone.

Draws: one uniform per sampled row from its own generator, inverted through its
cumulative distribution (``draws.py``, as the per-row path draws), so a seeded row
draws the same token whatever shares the batch and wherever it sits.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from worker.engine import SamplingParams, output_start
from worker.engine.draws import draw_tokens, uniform_draws
from worker.engine.sampling import nucleus
from worker.engine.sequence import Sequence
from worker.engine.token_counts import TokenCounts

Warp = Callable[[torch.Tensor], torch.Tensor]

# Columns per block of ``greedy_tokens``: on CPU torch's ``argmax`` reads a row at ~4 GB/s and its
# ``amax`` at ~50 (2 threads here), so the blocks' maxima come first and one block per row is
# searched after. 32 rows of 49,152 float32 logits: 1.99 -> 0.26 ms; 64 rows: 3.18 -> 0.42 ms.
ARGMAX_BLOCK = 128


def takes_own_path(params: SamplingParams, vocab: int) -> bool:
    """Whether a row must be sampled alone: a processor this module lacks, or a bias past the logits."""
    if params.no_repeat_ngram_size > 0 or (not params.is_greedy and params.typical_p < 1.0):
        return True
    return any(not 0 <= token < vocab for token, _ in params.logit_bias)


class BatchSampler:
    """Samples the rows of a step together; keeps the penalised rows' token counts between steps."""

    def __init__(self) -> None:
        self._counts = TokenCounts()
        self._buffer: torch.Tensor | None = None  # float32 scratch for a step's scores, reused

    def choose(self, rows: list[Sequence], logits: torch.Tensor) -> list[int | None]:
        """Each row's token from its row of ``logits`` ([rows, vocab]); None: sample that row alone.

        The rows must not take their own path (``takes_own_path``).
        """
        if all(row.generator is None and not row.needs_context for row in rows):
            plain = logits.dtype == torch.float32 and logits.is_contiguous()
            return greedy_tokens(logits if plain else self._scratch(logits)).tolist()
        scores = self.scores(rows, logits)
        greedy = [index for index, row in enumerate(rows) if row.request.sampling.is_greedy]
        sampled = [index for index, row in enumerate(rows) if not row.request.sampling.is_greedy]
        tokens: list[int | None] = [None] * len(rows)
        if greedy:
            for index, token in zip(greedy, greedy_tokens(_rows(scores, greedy)).tolist(), strict=True):
                tokens[index] = token
        if sampled:
            drawn = _draw([rows[i] for i in sampled], _rows(scores, sampled))
            for index, token in zip(sampled, drawn, strict=True):
                tokens[index] = token
        return tokens

    def scores(self, rows: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        """What each row's own processor list makes of its logits: float32 [rows, vocab].

        It may be this sampler's scratch: valid until its next call.
        """
        scores = self._scratch(logits)
        _add_biases(rows, scores)
        self._penalise(rows, scores)
        _hold_eos(rows, scores)
        sampled = [index for index, row in enumerate(rows) if not row.request.sampling.is_greedy]
        return _warp(rows, scores, sampled) if sampled else scores

    def _scratch(self, logits: torch.Tensor) -> torch.Tensor:
        """A float32 copy of ``logits`` (left intact: logprobs are scored on them) in a reused buffer.

        Fresh 6 MB tensors per operation (32 rows at 49,152 tokens) cost more in page faults than
        the operation when glibc hands them back between steps: 10.7 ms against 2.8 ms measured.
        """
        rows, vocab = logits.shape
        buffer = self._buffer
        if (
            buffer is None
            or buffer.shape[0] < rows
            or buffer.shape[1] != vocab
            or buffer.device != logits.device
        ):
            buffer = self._buffer = torch.empty((rows, vocab), dtype=torch.float32, device=logits.device)
        return buffer[:rows].copy_(logits)

    def _penalise(self, rows: list[Sequence], scores: torch.Tensor) -> None:
        """Repetition, then presence and frequency penalties, on the tokens each row has seen only."""
        repeated = [i for i, row in enumerate(rows) if row.request.sampling.repetition_penalty != 1.0]
        openai = [i for i, row in enumerate(rows) if _has_openai_penalty(row.request.sampling)]
        if not (repeated or openai):
            return
        counted = sorted({*repeated, *openai})
        output, seen = self._counts.of([rows[i] for i in counted], scores.shape[1], scores.device)
        slot = {index: position for position, index in enumerate(counted)}
        if repeated:
            _penalise_repeats(rows, scores, repeated, seen.index_select(0, _slots(slot, repeated, scores)))
        if openai:
            _penalise_openai(rows, scores, openai, output.index_select(0, _slots(slot, openai, scores)))


def _slots(slot: dict[int, int], indices: list[int], scores: torch.Tensor) -> torch.Tensor:
    return _index([slot[index] for index in indices], scores.device)


def _penalise_repeats(
    rows: list[Sequence], scores: torch.Tensor, indices: list[int], seen: torch.Tensor
) -> None:
    """Rows ``indices``' repetition penalty on the tokens ``seen`` marks ([len(indices), vocab] bool)."""
    at, tokens = seen.nonzero(as_tuple=True)
    penalties = _values([rows[i].request.sampling.repetition_penalty for i in indices], scores)[at]
    at = _index(indices, scores.device)[at]
    scores[at, tokens] = _repetition(scores[at, tokens], penalties)


def _penalise_openai(
    rows: list[Sequence], scores: torch.Tensor, indices: list[int], counts: torch.Tensor
) -> None:
    """Rows ``indices``' presence and frequency penalties on the tokens ``counts`` counts."""
    at, tokens = counts.nonzero(as_tuple=True)
    frequency = _values([rows[i].request.sampling.frequency_penalty for i in indices], scores)[at]
    presence = _values([rows[i].request.sampling.presence_penalty for i in indices], scores)[at]
    # The per-row processor's arithmetic, on the tokens it changes (a count of 0 changes nothing).
    penalty = frequency * counts[at, tokens] + presence * 1.0
    at = _index(indices, scores.device)[at]
    scores[at, tokens] = scores[at, tokens] - penalty


def _has_openai_penalty(params: SamplingParams) -> bool:
    return bool(params.presence_penalty or params.frequency_penalty)


def _repetition(scores: torch.Tensor, penalties: torch.Tensor) -> torch.Tensor:
    # transformers' rule: a negative logit is multiplied by the penalty, any other divided by it.
    return torch.where(scores < 0, scores * penalties, scores / penalties)


def _add_biases(rows: list[Sequence], scores: torch.Tensor) -> None:
    entries = [
        (i, token, bias) for i, row in enumerate(rows) for token, bias in row.request.sampling.logit_bias
    ]
    if not entries:
        return
    row_ids, tokens, biases = zip(*entries, strict=True)
    values = torch.tensor(biases, dtype=scores.dtype, device=scores.device)
    scores.index_put_(
        (_index(row_ids, scores.device), _index(tokens, scores.device)), values, accumulate=True
    )


def _hold_eos(rows: list[Sequence], scores: torch.Tensor) -> None:
    """EOS at -inf in the rows that have not generated their min_new_tokens yet."""
    vocab = scores.shape[1]
    entries = [
        (index, eos)
        for index, row in enumerate(rows)
        if len(row.token_ids) - output_start(row.request) < row.request.sampling.min_new_tokens
        for eos in row.request.eos_token_ids
        if eos < vocab  # transformers masks ids within the logits only
    ]
    if entries:
        row_ids, tokens = zip(*entries, strict=True)
        hold = torch.tensor(-math.inf, dtype=scores.dtype, device=scores.device)
        scores.index_put_((_index(row_ids, scores.device), _index(tokens, scores.device)), hold)


def _warp(rows: list[Sequence], scores: torch.Tensor, sampled: list[int]) -> torch.Tensor:
    """Temperature, top_k, top_p then min_p (transformers' warper order), on the sampled rows only."""
    params = [row.request.sampling for row in rows]
    temperatures = _column([params[i].temperature for i in sampled], scores)
    scores = _rework(scores, sampled, lambda s: s.div_(temperatures))
    top_k = [i for i in sampled if params[i].top_k > 0]
    if top_k:
        scores = _rework(scores, top_k, _top_k([min(params[i].top_k, scores.shape[1]) for i in top_k]))
    top_p = [i for i in sampled if params[i].top_p < 1.0]
    if top_p:
        cutoffs = _column([params[i].top_p for i in top_p], scores)
        scores = _rework(scores, top_p, lambda s: nucleus(s, cutoffs))
    min_p = [i for i in sampled if params[i].min_p > 0.0]
    if min_p:
        scores = _rework(scores, min_p, _min_p(_column([params[i].min_p for i in min_p], scores)))
    return scores


def _top_k(ks: list[int]) -> Warp:
    def warp(scores: torch.Tensor) -> torch.Tensor:
        kth = scores.topk(max(ks), dim=-1).values.gather(
            1, _index([k - 1 for k in ks], scores.device)[:, None]
        )
        return scores.masked_fill_(scores < kth, -math.inf)

    return warp


def _min_p(minimums: torch.Tensor) -> Warp:
    def warp(scores: torch.Tensor) -> torch.Tensor:
        probabilities = scores.softmax(dim=-1)
        drop = probabilities < minimums * probabilities.amax(dim=-1, keepdim=True)
        return scores.masked_fill_(drop, -math.inf)

    return warp


def _draw(rows: list[Sequence], scores: torch.Tensor) -> list[int | None]:
    """A token per sampled row from its own generator; None for a row without a valid distribution."""
    generators = [row.generator for row in rows if row.generator is not None]
    if len(generators) != len(rows):
        raise RuntimeError("a sampled sequence has no generator")
    tokens, valid = draw_tokens(torch.softmax(scores, dim=-1), uniform_draws(generators, scores.device))
    return [int(token) if ok else None for token, ok in zip(tokens.tolist(), valid.tolist(), strict=True)]


def _rework(scores: torch.Tensor, rows: list[int], warp: Warp) -> torch.Tensor:
    """``scores`` with ``rows`` replaced by ``warp`` of them, which may change what it is given."""
    if rows == list(range(scores.shape[0])):
        return warp(scores)
    index = _index(rows, scores.device)
    return scores.index_copy_(0, index, warp(scores.index_select(0, index)))


def greedy_tokens(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(dim=-1)`` of ``[rows, vocab]`` scores, the same indices (the first of tied
    maxima, the first NaN), found block by block on CPU (``ARGMAX_BLOCK``)."""
    rows, vocab = scores.shape
    if scores.device.type != "cpu" or vocab % ARGMAX_BLOCK or not scores.is_contiguous():
        return scores.argmax(dim=-1)
    blocks = scores.view(rows, vocab // ARGMAX_BLOCK, ARGMAX_BLOCK)
    # amax propagates NaN as argmax ranks it (above everything), and argmax takes the first of
    # equal maxima: the first block holding the row's first maximum, then its place in the block.
    block = blocks.amax(dim=-1).argmax(dim=-1)
    inner = blocks[torch.arange(rows, device=scores.device), block].argmax(dim=-1)
    return block * ARGMAX_BLOCK + inner


def _rows(scores: torch.Tensor, rows: list[int]) -> torch.Tensor:
    if rows == list(range(scores.shape[0])):
        return scores
    return scores.index_select(0, _index(rows, scores.device))


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    """Per-row values as a float32 column, so they broadcast along each row (as a Python scalar would)."""
    return _values(values, like)[:, None]


def _values(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def _index(values: list[int] | tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
