"""Owns the penalised rows' token counts across steps, kept as tensors and updated with each new token.

Repetition, presence and frequency penalties need, per row, which tokens its prompt
or output holds and how often each came out of it. Rebuilding that from every row's history
each step turns thousands of Python ints into a tensor per step; instead the counts
live in ``[rows, vocab + 1]`` tensors, one pair per batch composition, and a step
only adds the tokens accepted since the last one (one ``index_put_`` for the batch).
The last column takes ids past the logits' width, which the penalties ignore
(transformers' repetition penalty pads and drops them the same way).

Two compositions are kept: the decode batch and the prompts that just prefilled.
A row joining or leaving starts a new composition, which copies the rows it shares
with the kept ones and counts only new rows from their history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from worker.engine import output_start
from worker.engine.sequence import Sequence

KEPT_COMPOSITIONS = 2


@dataclass
class _Counts:
    rows: tuple[Sequence, ...]
    counted: list[int]  # how many of each row's token ids are in ``output`` or ``prompt``
    output: torch.Tensor  # [rows, vocab + 1] float32: times each token came out of the row
    seen: torch.Tensor  # [rows, vocab + 1] bool: whether the row's prompt or output holds each token
    positions: dict[int, int] = field(default_factory=dict)  # id(row) -> its index in ``rows``

    def position(self, row: Sequence) -> int | None:
        index = self.positions.get(id(row))
        return index if index is not None and self.rows[index] is row else None


class TokenCounts:
    """Output counts and prompt presence of the rows asked for, kept between steps."""

    def __init__(self) -> None:
        self._kept: list[_Counts] = []  # most recently used first

    def of(self, rows: list[Sequence], vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows``' output counts ([rows, vocab] float32) and tokens in their prompt or output (bool)."""
        counts = self._find(rows, vocab, device) or self._compose(rows, vocab, device)
        # Out of the kept ones while it changes: a failure leaves nothing half-counted behind.
        self._kept = [kept for kept in self._kept if kept is not counts]
        _count_new_tokens(counts, vocab)
        self._kept = [counts, *self._kept][:KEPT_COMPOSITIONS]
        return counts.output[:, :vocab], counts.seen[:, :vocab]

    def _find(self, rows: list[Sequence], vocab: int, device: torch.device) -> _Counts | None:
        for counts in self._kept:
            same = len(counts.rows) == len(rows) and all(
                a is b for a, b in zip(counts.rows, rows, strict=True)
            )
            if same and counts.output.shape[1] == vocab + 1 and counts.output.device == device:
                return counts
        return None

    def _compose(self, rows: list[Sequence], vocab: int, device: torch.device) -> _Counts:
        """A composition's counts: rows a kept one holds are copied, the others start from their prompt."""
        counts = _Counts(
            rows=tuple(rows),
            counted=[0] * len(rows),
            output=torch.zeros((len(rows), vocab + 1), dtype=torch.float32, device=device),
            seen=torch.zeros((len(rows), vocab + 1), dtype=torch.bool, device=device),
            positions={id(row): index for index, row in enumerate(rows)},
        )
        fresh = []
        for index, row in enumerate(rows):
            if not self._copy_kept(row, counts, index):
                fresh.append(index)
        _mark_prompts(counts, fresh, vocab)
        return counts

    def _copy_kept(self, row: Sequence, into: _Counts, index: int) -> bool:
        for kept in self._kept:
            position = kept.position(row)
            if position is None or kept.output.shape[1] != into.output.shape[1]:
                continue
            into.output[index] = kept.output[position]
            into.seen[index] = kept.seen[position]
            into.counted[index] = kept.counted[position]
            return True
        return False


def _mark_prompts(counts: _Counts, fresh: list[int], vocab: int) -> None:
    """Mark each fresh row's prompt tokens; its output tokens are counted next, as new ones."""
    rows: list[int] = []
    tokens: list[int] = []
    for index in fresh:
        request = counts.rows[index].request
        prompt = request.prompt_token_ids[: output_start(request)]
        rows += [index] * len(prompt)
        tokens += prompt
        counts.counted[index] = len(prompt)
    if tokens:
        device = counts.seen.device
        ids = torch.tensor(tokens, device=device).clamp_(max=vocab)
        counts.seen.index_put_((torch.tensor(rows, device=device), ids), torch.tensor(True, device=device))


def _count_new_tokens(counts: _Counts, vocab: int) -> None:
    """Add the tokens each row accepted since it was last counted."""
    rows: list[int] = []
    tokens: list[int] = []
    for index, row in enumerate(counts.rows):
        new = row.token_ids[counts.counted[index] :]
        rows += [index] * len(new)
        tokens += new
    if tokens:
        device = counts.output.device
        ids = torch.tensor(tokens, device=device).clamp_(max=vocab)
        ones = torch.ones(len(tokens), dtype=torch.float32, device=device)
        positions = (torch.tensor(rows, device=device), ids)
        counts.output.index_put_(positions, ones, accumulate=True)
        counts.seen.index_put_(positions, torch.tensor(True, device=device))
    counts.counted = [len(row.token_ids) for row in counts.rows]
