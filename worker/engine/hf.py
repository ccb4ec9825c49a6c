"""Owns the transformers backend: runs a causal LM one step at a time for many sequences.

Cache layout: each sequence keeps its own KV cache (``DynamicCache`` unless
``cache_implementation`` says otherwise) and every running sequence advances one
token per ``step()``. Sequences join and leave between steps, so a new request
starts within one step, but they do not yet share a forward pass: throughput
stays at single-sequence speed (about 12 tok/s in total for SmolLM2-135M on
2 CPU cores). Padded/paged batching replaces the per-sequence loop behind the
same ``Engine`` interface.

Beam search (``num_beams > 1``) cannot be stepped alongside others here, so it
runs on a single-request path through ``model.generate`` and reports all of its
tokens in one update.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel, StaticCache
from transformers.cache_utils import Cache

from shared.protocol import FinishReason
from worker.engine import EngineRequest, SequenceUpdate
from worker.engine.sampling import build_processors, choose_token, make_generator

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


class TransformersEngine:
    """An ``Engine`` over a loaded ``PreTrainedModel``."""

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
        self._waiting.append(request)

    def abort(self, request_id: str) -> None:
        self._running.pop(request_id, None)
        self._waiting = deque(request for request in self._waiting if request.request_id != request_id)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def close(self) -> None:
        self._waiting.clear()
        self._running.clear()

    @torch.inference_mode()
    def step(self) -> list[SequenceUpdate]:
        self._admit()
        updates = [self._advance(sequence) for sequence in list(self._running.values())]
        for update in updates:
            if update.is_finished:
                self._running.pop(update.request_id, None)
        return updates

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self._max_batch_size:
            request = self._waiting.popleft()
            self._running[request.request_id] = _Sequence(
                request=request,
                token_ids=list(request.prompt_token_ids),
                processors=build_processors(
                    request.sampling, len(request.prompt_token_ids), request.eos_token_ids
                ),
                generator=make_generator(request.sampling, self._device),
                pending=list(request.prompt_token_ids),
            )

    def _advance(self, sequence: _Sequence) -> SequenceUpdate:
        if sequence.request.sampling.num_beams > 1:
            return self._beam_search(sequence)
        logits = self._forward(sequence)
        all_ids = torch.tensor([sequence.token_ids], device=self._device)
        token = choose_token(logits, all_ids, sequence.processors, sequence.generator)  # type: ignore[arg-type]
        sequence.token_ids.append(token)
        sequence.pending = [token]
        sequence.generated += 1
        return SequenceUpdate(sequence.request_id, (token,), _finish_reason(sequence, token))

    def _forward(self, sequence: _Sequence) -> torch.Tensor:
        if not self._use_cache:
            input_ids = torch.tensor([sequence.token_ids], device=self._device)
            return self._model(input_ids=input_ids, use_cache=False).logits[:, -1, :]  # type: ignore[no-any-return]
        if sequence.cache is None:
            sequence.cache = self._new_cache(sequence.request)
        input_ids = torch.tensor([sequence.pending], device=self._device)
        output = self._model(input_ids=input_ids, past_key_values=sequence.cache, use_cache=True)
        return output.logits[:, -1, :]  # type: ignore[no-any-return]

    def _new_cache(self, request: EngineRequest) -> Cache:
        if self._cache_implementation == "static":
            length = len(request.prompt_token_ids) + request.max_new_tokens
            return StaticCache(config=self._model.config, max_cache_len=length)
        return DynamicCache(config=self._model.config)

    def _beam_search(self, sequence: _Sequence) -> SequenceUpdate:
        request = sequence.request
        prompt = torch.tensor([list(request.prompt_token_ids)], device=self._device)
        output = self._model.generate(  # type: ignore[operator]
            prompt, attention_mask=torch.ones_like(prompt), **_beam_options(request)
        )
        new_tokens = tuple(int(token) for token in output[0, prompt.shape[1] :])
        ends_on_eos = bool(new_tokens) and new_tokens[-1] in request.eos_token_ids
        # generate pads finished beams with the pad token (often EOS); keep up to the first EOS.
        if request.eos_token_ids:
            for index, token in enumerate(new_tokens):
                if token in request.eos_token_ids:
                    new_tokens, ends_on_eos = new_tokens[: index + 1], True
                    break
        return SequenceUpdate(
            request.request_id, new_tokens, FinishReason.STOP if ends_on_eos else FinishReason.LENGTH
        )


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


def _finish_reason(sequence: _Sequence, token: int) -> FinishReason | None:
    if token in sequence.request.eos_token_ids:
        return FinishReason.STOP
    if sequence.generated >= sequence.request.max_new_tokens:
        return FinishReason.LENGTH
    return None
