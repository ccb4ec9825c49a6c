"""Owns keeping one sequence's failure from failing the batch: sampling rows one by one, bisecting forwards.

A request the worker's preparation let through can still break a step: its prompt
can make the forward pass raise (an id the embedding does not have, on a model
whose tokenizer knows more ids than its weights), its sampling can raise (a
processor on values nobody foresaw). Failing the whole step would fail every
request in the batch, other tenants' included. Instead:

* the rows sample together (``batch_sampling.py``), except those that need the
  per-row path; when sampling them together raises, each row samples alone for that
  step (``sample_rows``): a row whose sampling raises gets a ``failed`` update, the
  others their tokens; so does a constrained row whose grammar matcher broke or
  refuses its token;
* a forward over several new prompts that raises runs again in halves
  (``bisect``), down to the prompt that fails alone; the others run as if it had
  never been there, since a prefill forward writes only into a fresh cache;
* a decode forward that raises is forgotten (``SlotKVCache.abandon``), each row is
  tried alone on a copy of its cache (``decodes_alone``), the rows that fail alone
  leave and the rest decode again (``worker/engine/hf.py``).

Every failure is logged here with its traceback; clients only ever see
``worker_failed`` with a fixed message (the driver's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch
from transformers import PreTrainedModel

from worker.engine import SequenceUpdate, TokenScore, failed_update
from worker.engine.batch_sampling import BatchSampler, takes_own_path
from worker.engine.kv_cache import single_row_cache
from worker.engine.sampling import choose_token, score_tokens, trim_score
from worker.engine.sequence import Sequence
from worker.engine.slot_cache import SlotKVCache
from worker.engine.token_masks import TokenMasks

logger = logging.getLogger(__name__)


def guarded(request_id: str, work: Callable[[], SequenceUpdate]) -> SequenceUpdate:
    """``work()``'s update, or a ``failed`` update for ``request_id`` when it raises."""
    try:
        return work()
    except Exception:
        logger.exception("sequence %s failed; failing it alone", request_id)
        return failed_update(request_id)


def bisect(
    run: Callable[[list[Sequence]], list[SequenceUpdate]], sequences: list[Sequence]
) -> list[SequenceUpdate]:
    """``run(sequences)``; when it raises, each half again, down to the sequences that fail alone.

    ``run`` must change nothing before it can no longer raise, so a retry starts clean.
    """
    try:
        return run(sequences)
    except Exception:
        if len(sequences) == 1:
            logger.exception("sequence %s failed; failing it alone", sequences[0].request_id)
            return [failed_update(sequences[0].request_id)]
        logger.warning("a forward of %d sequences failed; retrying them in halves", len(sequences))
    middle = len(sequences) // 2
    return bisect(run, sequences[:middle]) + bisect(run, sequences[middle:])


def failing_alone(model: PreTrainedModel, kv: SlotKVCache, rows: list[Sequence]) -> set[str]:
    """The rows of ``kv`` (``rows[i]`` is row i) whose next decode fails in a forward of their own."""
    return {
        row.request_id
        for index, row in enumerate(rows)
        if not _decodes_alone(model, kv, index, row.token_ids[-1])
    }


def _decodes_alone(model: PreTrainedModel, kv: SlotKVCache, row: int, token: int) -> bool:
    """Whether row ``row`` of ``kv`` decodes ``token`` in a forward of its own, on a copy of its cache."""
    layers = kv.row_kv(row)
    length = int(layers[0][0].shape[1])
    device = layers[0][0].device
    try:
        model(
            input_ids=torch.tensor([[token]], device=device),
            attention_mask=torch.ones((1, length + 1), dtype=torch.long, device=device),
            position_ids=torch.tensor([[length]], device=device),
            past_key_values=single_row_cache(layers, model.config),
            use_cache=True,
            logits_to_keep=1,
        )
    except Exception:
        logger.exception("a decode forward failed for row %d alone", row)
        return False
    return True


# A row's sampled token and its score (when it asked for logprobs); None when its sampling raised.
Choice = tuple[int, TokenScore | None] | None


def sample_rows(
    rows: list[Sequence],
    logits: torch.Tensor,
    masks: TokenMasks | None = None,
    sampler: BatchSampler | None = None,
) -> list[Choice]:
    """Each row's next token from its row of ``logits`` ([rows, vocab]); ``accept_rows`` applies them.

    Constrained rows choose from their grammar's tokens only (``masks``); scores stay on the raw logits.
    ``sampler`` keeps state between the steps of one batch (an engine owns one); None: a fresh one.
    """
    constrained = _constrained_logits(rows, logits, masks)
    tokens = _choose_rows(rows, logits, constrained, sampler or BatchSampler())
    scores = _score_rows(rows, logits, tokens)
    return [None if token is None else (token, scores.get(index)) for index, token in enumerate(tokens)]


def accept_rows(rows: list[Sequence], choices: list[Choice]) -> list[SequenceUpdate]:
    """Each row takes its token; a row whose sampling raised, or whose grammar refuses its token, fails."""
    return [
        failed_update(row.request_id)
        if choice is None
        else guarded(row.request_id, partial(row.accept, *choice))
        for row, choice in zip(rows, choices, strict=True)
    ]


def _constrained_logits(
    rows: list[Sequence], logits: torch.Tensor, masks: TokenMasks | None
) -> dict[int, torch.Tensor | None]:
    """The masked logits of the rows with a grammar, by row index (None: the row cannot go on)."""
    # A dormant grammar (its model still thinking) leaves its row free this step.
    matchers = [
        (index, row.gate) for index, row in enumerate(rows) if row.gate is not None and row.gate.needs_mask
    ]
    if not matchers:
        return {}
    if masks is None:
        raise RuntimeError("a constrained sequence reached an engine without token masks")
    try:
        return masks.constrain(matchers, logits)
    except Exception:
        logger.exception("filling grammar masks failed; failing the %d constrained rows alone", len(matchers))
        return {index: None for index, _ in matchers}


def _choose_rows(
    rows: list[Sequence],
    logits: torch.Tensor,
    constrained: dict[int, torch.Tensor | None],
    sampler: BatchSampler,
) -> list[int | None]:
    """The tokens the batched path picks, then each other row's alone; None for a row that cannot go on."""
    broken = {index for index, masked in constrained.items() if masked is None}
    vocab = logits.shape[-1]
    together = [
        index
        for index, row in enumerate(rows)
        if index not in broken and not takes_own_path(row.request.sampling, vocab)
    ]
    chosen = _choose_together(rows, logits, constrained, together, sampler)
    return [
        chosen[index] if index in chosen else _choose_alone(row, index, logits, constrained)
        for index, row in enumerate(rows)
    ]


def _choose_together(
    rows: list[Sequence],
    logits: torch.Tensor,
    constrained: dict[int, torch.Tensor | None],
    together: list[int],
    sampler: BatchSampler,
) -> dict[int, int]:
    """Tokens of the rows ``together`` by row index; those it cannot pick are left out."""
    if not together:
        return {}
    try:
        tokens = sampler.choose(
            [rows[index] for index in together], _logits_of(logits, together, constrained)
        )
    except Exception:
        logger.exception("sampling %d rows together failed; each samples alone this step", len(together))
        return {}
    return {index: token for index, token in zip(together, tokens, strict=True) if token is not None}


def _logits_of(
    logits: torch.Tensor, indices: list[int], constrained: dict[int, torch.Tensor | None]
) -> torch.Tensor:
    """Rows ``indices`` of ``logits``, with each constrained row's masked copy in place of its own."""
    selected = logits if indices == list(range(logits.shape[0])) else logits[indices]
    masked = [
        (position, constrained[index]) for position, index in enumerate(indices) if index in constrained
    ]
    if masked and selected is logits:
        selected = logits.clone()  # the raw logits are scored for logprobs
    for position, row_logits in masked:
        if row_logits is not None:
            selected[position] = row_logits[0]
    return selected


def _choose_alone(
    row: Sequence, index: int, logits: torch.Tensor, constrained: dict[int, torch.Tensor | None]
) -> int | None:
    """Row ``index``'s token on the per-row path; None when it cannot go on."""
    own = constrained[index] if index in constrained else logits[index : index + 1]
    if own is None:  # its grammar broke or allows nothing
        return None
    return _choose(row, own, int(own.argmax(dim=-1).item()))


def _choose(row: Sequence, logits: torch.Tensor, greedy: int) -> int | None:
    if row.generator is None and not row.needs_context:
        return greedy
    try:
        history = torch.tensor([row.token_ids], device=logits.device)
        return choose_token(logits, history, row.processors, row.generator)  # type: ignore[arg-type]
    except Exception:
        logger.exception("sampling failed for sequence %s; failing it alone", row.request_id)
        return None


def _score_rows(
    rows: list[Sequence], logits: torch.Tensor, tokens: list[int | None]
) -> dict[int, TokenScore]:
    """Scores of the sampled tokens of the rows that asked for logprobs, by row index."""
    wanted = [i for i, row in enumerate(rows) if row.request.logprobs is not None and tokens[i] is not None]
    if not wanted:
        return {}
    top = max(rows[index].request.logprobs or 0 for index in wanted)
    scores = score_tokens(logits[wanted], [tokens[index] or 0 for index in wanted], top)
    return {
        index: trim_score(score, rows[index].request.logprobs or 0)
        for index, score in zip(wanted, scores, strict=True)
    }
