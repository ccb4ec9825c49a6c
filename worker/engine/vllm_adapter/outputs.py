"""Owns the translation of vLLM's ``RequestOutput`` deltas into ``SequenceUpdate``s.

vLLM reports log-probabilities of the raw distribution by default (``logprobs_mode``
``raw_logprobs``), as the native engine does: each position is a map from token id to
``Logprob`` holding the chosen token and the ``k`` most likely ones, ranked. A
position's chosen token outside the top ``k`` is in the map with its rank beyond ``k``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shared.protocol import FinishReason
from worker.engine import EngineRequest, SequenceUpdate, TokenScore

# vLLM's finish reasons; "abort" never reaches the driver (it asked for the abort itself).
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


def update_of(output: Any, request: EngineRequest, first: bool = True) -> SequenceUpdate:
    """One request's delta (``RequestOutputKind.DELTA``) as the driver's update; ``first`` for
    the request's first delta, the one that reports its prefix-cache hits."""
    (completion,) = output.outputs
    token_ids = tuple(completion.token_ids)
    logprobs = None
    if request.logprobs is not None and completion.logprobs is not None:
        logprobs = tuple(
            _score(token_id, position, request.logprobs)
            for token_id, position in zip(token_ids, completion.logprobs, strict=True)
        )
    prompt_logprobs = None
    if request.prompt_logprobs is not None and output.prompt_logprobs:  # the first delta's; later ones []
        prompt_logprobs = _prompt_scores(request, output.prompt_logprobs)
    finish = _FINISH.get(completion.finish_reason) if completion.finish_reason else None
    return SequenceUpdate(
        output.request_id,
        token_ids,
        finish,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        # Later deltas repeat it: reported once.
        cached_prompt_tokens=getattr(output, "num_cached_tokens", None) if first else None,
    )


def _score(token_id: int, position: Mapping[int, Any], k: int) -> TokenScore:
    ranked = sorted(
        ((other, entry) for other, entry in position.items() if entry.rank is not None and entry.rank <= k),
        key=lambda item: item[1].rank,
    )
    top = tuple((other, float(entry.logprob)) for other, entry in ranked[:k])
    return TokenScore(token_id, float(position[token_id].logprob), top)


def _prompt_scores(
    request: EngineRequest, positions: Iterable[Mapping[int, Any] | None]
) -> tuple[TokenScore | None, ...]:
    assert request.prompt_logprobs is not None
    scores: list[TokenScore | None] = []
    for token_id, position in zip(request.prompt_token_ids, positions, strict=True):
        scores.append(None if position is None else _score(token_id, position, request.prompt_logprobs))
    return tuple(scores)
