"""Owns the per-sequence transformers backend: every sequence runs its own forward pass.

Each sequence keeps its own KV cache (``DynamicCache``, or a ``StaticCache`` sized
to prompt plus max tokens) or none at all (``--disable-kv-cache`` recomputes the
whole sequence each step). Sequences join and leave between steps but do not
share forward passes, so throughput stays at single-sequence speed (~12 tok/s for
SmolLM2-135M on 2 CPU cores). The batched engine (``hf.py``) is the default; this
one serves the cache options the padded batch cannot honour.

Beam search (``num_beams > 1``) runs on a single-request path through
``model.generate`` and reports all of its tokens in one update; it reports no
logprobs (preparation refuses logprobs with beam search).

A sequence that fails (its start, its forward, its sampling) fails alone: it has a
cache of its own, so the others never see its failure.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel, StaticCache
from transformers.cache_utils import Cache

from shared.protocol import FinishReason
from worker.engine import EngineRequest, EngineStats, SequenceUpdate, TokenScore, failed_update, output_start
from worker.engine.isolation import guarded
from worker.engine.sampling import build_processors, choose_token, make_generator, score_tokens
from worker.engine.scheduler import final_length, queue_by_priority

logger = logging.getLogger(__name__)


@dataclass
class _Sequence:
    request: EngineRequest
    token_ids: list[int]
    processors: LogitsProcessorList
    generator: torch.Generator | None
    cache: Cache | None = None
    generated: int = 0
    pending: list[int] = field(default_factory=list)  # tokens not yet fed to the model

    @property
    def request_id(self) -> str:
        return self.request.request_id


class SequentialEngine:
    """An ``Engine`` running one forward pass per sequence per step."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        max_batch_size: int,
        cache_implementation: str | None = None,
        use_cache: bool = True,
    ) -> None:
        self._model = model
        self._device = model.device
        self._max_batch_size = max_batch_size
        self._cache_implementation = cache_implementation or "dynamic"
        self._use_cache = use_cache
        self._waiting: deque[EngineRequest] = deque()
        self._running: dict[str, _Sequence] = {}
        if self._cache_implementation not in ("dynamic", "static"):
            raise ValueError(
                f"cache_implementation {cache_implementation!r} is not supported (dynamic, static)"
            )

    def add(self, request: EngineRequest) -> None:
        queue_by_priority(self._waiting, request)

    def abort(self, request_id: str) -> None:
        self._running.pop(request_id, None)
        self._waiting = deque(request for request in self._waiting if request.request_id != request_id)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def stats(self) -> EngineStats:
        # Each sequence has a cache of its own, bounded by the batch size rather than a token budget.
        reserved = sum(final_length(sequence.request) for sequence in self._running.values())
        return EngineStats(len(self._running), len(self._waiting), kv_reserved_tokens=reserved)

    def close(self) -> None:
        self._waiting.clear()
        self._running.clear()

    @torch.inference_mode()
    def step(self) -> list[SequenceUpdate]:
        updates = self._admit()
        updates += [
            guarded(sequence.request_id, partial(self._advance, sequence))
            for sequence in list(self._running.values())
        ]
        for update in updates:
            if update.is_finished:
                self._running.pop(update.request_id, None)
        return updates

    def _admit(self) -> list[SequenceUpdate]:
        """Start the waiting requests that fit; those that cannot start fail alone."""
        failed: list[SequenceUpdate] = []
        while self._waiting and len(self._running) < self._max_batch_size:
            request = self._waiting.popleft()
            try:
                self._running[request.request_id] = _start(request, self._device)
            except Exception:
                logger.exception("sequence %s could not start; failing it alone", request.request_id)
                failed.append(failed_update(request.request_id))
        return failed

    def _advance(self, sequence: _Sequence) -> SequenceUpdate:
        if sequence.request.sampling.num_beams > 1:
            return self._beam_search(sequence)
        request = sequence.request
        # The first forward covers the whole prompt: keep all its logits when prompt logprobs are asked.
        scores_prompt = sequence.generated == 0 and request.prompt_logprobs is not None
        all_logits = self._forward(sequence, keep_all=scores_prompt)
        logits = all_logits[:, -1, :]
        all_ids = torch.tensor([sequence.token_ids], device=self._device)
        token = choose_token(logits, all_ids, sequence.processors, sequence.generator)  # type: ignore[arg-type]
        sequence.token_ids.append(token)
        sequence.pending = [token]
        sequence.generated += 1
        return SequenceUpdate(
            sequence.request_id,
            (token,),
            _finish_reason(sequence, token),
            logprobs=None
            if request.logprobs is None
            else tuple(score_tokens(logits, [token], request.logprobs)),
            prompt_logprobs=_prompt_scores(request, all_logits[0]) if scores_prompt else None,
        )

    def _forward(self, sequence: _Sequence, *, keep_all: bool) -> torch.Tensor:
        """Logits ``[1, positions, vocab]``: the last position only, unless ``keep_all``."""
        if not self._use_cache:
            input_ids = torch.tensor([sequence.token_ids], device=self._device)
            return self._model(input_ids=input_ids, use_cache=False).logits  # type: ignore[no-any-return]
        if sequence.cache is None:
            sequence.cache = self._new_cache(sequence.request)
        input_ids = torch.tensor([sequence.pending], device=self._device)
        output = self._model(
            input_ids=input_ids,
            past_key_values=sequence.cache,
            use_cache=True,
            logits_to_keep=0 if keep_all else 1,
        )
        return output.logits  # type: ignore[no-any-return]

    def _new_cache(self, request: EngineRequest) -> Cache:
        if self._cache_implementation == "static":
            length = len(request.prompt_token_ids) + request.max_new_tokens
            return StaticCache(config=self._model.config, max_cache_len=length)
        return DynamicCache(config=self._model.config)

    def _beam_search(self, sequence: _Sequence) -> SequenceUpdate:
        return run_beam_search(self._model, sequence.request)


def _start(request: EngineRequest, device: torch.device) -> _Sequence:
    return _Sequence(
        request=request,
        token_ids=list(request.prompt_token_ids),
        processors=build_processors(request.sampling, output_start(request), request.eos_token_ids),
        generated=request.resumed_tokens,
        generator=make_generator(request.sampling, device),
        pending=list(request.prompt_token_ids),
    )


def run_beam_search(model: PreTrainedModel, request: EngineRequest) -> SequenceUpdate:
    """The single-request path for ``num_beams > 1``: all tokens in one update."""
    prompt = torch.tensor([list(request.prompt_token_ids)], device=model.device)
    output = model.generate(  # type: ignore[operator]
        prompt, attention_mask=torch.ones_like(prompt), **_beam_options(request)
    )
    new_tokens = tuple(int(token) for token in output[0, prompt.shape[1] :])
    # generate pads finished beams with the pad token (often EOS); keep up to the first EOS.
    first_eos = next((i for i, token in enumerate(new_tokens) if token in request.eos_token_ids), None)
    if first_eos is not None:
        new_tokens = new_tokens[: first_eos + 1]
    reason = FinishReason.STOP if first_eos is not None else FinishReason.LENGTH
    return SequenceUpdate(request.request_id, new_tokens, reason)


def _beam_options(request: EngineRequest) -> dict[str, Any]:
    params = request.sampling
    eos = sorted(request.eos_token_ids)
    return {
        "num_beams": params.num_beams,
        "do_sample": False,
        "max_new_tokens": request.max_new_tokens,
        "min_new_tokens": params.min_new_tokens,
        "length_penalty": params.length_penalty,
        "repetition_penalty": params.repetition_penalty,
        "no_repeat_ngram_size": params.no_repeat_ngram_size,
        # An empty EOS list means ignore_eos: give generate an id it can never produce.
        "eos_token_id": eos or -1,
        "early_stopping": True,
    }


def _prompt_scores(request: EngineRequest, logits: torch.Tensor) -> tuple[TokenScore | None, ...]:
    """Each prompt token scored by the logits of the position before it (``logits``: [prompt, vocab])."""
    prompt = request.prompt_token_ids
    return (None, *score_tokens(logits[: len(prompt) - 1], prompt[1:], request.prompt_logprobs or 0))


def _finish_reason(sequence: _Sequence, token: int) -> FinishReason | None:
    if token in sequence.request.eos_token_ids:
        return FinishReason.STOP
    if sequence.generated >= sequence.request.max_new_tokens:
        return FinishReason.LENGTH
    return None
