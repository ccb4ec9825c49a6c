"""Owns the fake backend: a deterministic engine and a byte tokenizer for testing everything around the model.

``ByteTokenizer`` maps each UTF-8 byte to its own token id, so any character
beyond ASCII is split over several tokens, exactly the case the incremental
detokenizer exists for. ``FakeEngine`` "generates" the bytes of a fixed script.

What a request generates depends only on the request, never on the batch:

* the script's bytes in order, cycling, from an offset: 0 when greedy, else one
  derived from the seed, or from the prompt when there is no seed (``zlib.crc32``:
  Python's ``hash`` is salted per process and would break reproducibility);
* EOS once a whole script's length of tokens has been generated, or as soon as
  ``min_new_tokens`` allows it after that (the "model" wants to stop from the end
  of the script on, and min_new_tokens only holds it off);
* no EOS at all when the request's EOS set is empty (``ignore_eos``): it cycles until
  ``max_new_tokens``.

A sequence that emits EOS finishes with "stop" even on its last allowed token (the
EOS counts towards ``max_new_tokens`` and is reported in ``new_token_ids``);
otherwise reaching ``max_new_tokens`` finishes it with "length". One token per
running sequence per step; at most ``max_batch_size`` run, the rest wait in FIFO
order and join as slots free up. Like every engine it is driven from one thread.

Like a model, it cannot run a prompt holding an id outside its vocabulary (the
bytes and EOS, ``FAKE_VOCAB_SIZE``): that sequence fails alone at its first step
(a ``failed`` update) and the others go on, as the transformers engines' do.

Logprobs are made up but deterministic and shaped like a model's: the chosen token
is always the most likely one (``fake_score``), alternatives follow it one nat apart.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.protocol import ChatMessage, FinishReason, FunctionTool
from worker.engine import EngineRequest, EngineStats, SequenceUpdate, TokenScore, failed_update, output_start
from worker.requests.chat_input import template_input

BYTE_VOCAB_SIZE = 256
EOS_TOKEN_ID = 256
FAKE_VOCAB_SIZE = EOS_TOKEN_ID + 1  # every id the fake "model" knows: the bytes, then EOS


class ByteTokenizer:
    """Token id = UTF-8 byte value; id 256 is EOS; no BOS."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({EOS_TOKEN_ID})

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        data = bytes(token_id for token_id in token_ids if 0 <= token_id < BYTE_VOCAB_SIZE)
        return data.decode("utf-8", errors="replace")

    @property
    def chat_template_source(self) -> str | None:
        return None  # plain "role: content" lines, without tool support (tools take the fallback)

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool,
        tools: Sequence[FunctionTool] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        conversation, _ = template_input(messages, tools, template=None)
        lines = "".join(f"{message['role']}: {message['content'] or ''}\n" for message in conversation)
        return lines + ("assistant:" if add_generation_prompt else "")


@dataclass(slots=True)
class _Sequence:
    request: EngineRequest
    offset: int  # where in the script this sequence started
    generated: int = 0  # tokens emitted so far, EOS included
    in_vocabulary: bool = True  # whether every prompt id is one the fake knows


class FakeEngine:
    """Implements the ``Engine`` protocol without a model."""

    def __init__(self, script: str, *, step_delay_s: float = 0.0, max_batch_size: int = 64) -> None:
        if not script:
            raise ValueError("the fake engine's script must not be empty")
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self._script = script.encode("utf-8")
        self._step_delay_s = step_delay_s
        self._max_batch_size = max_batch_size
        # Dicts keep insertion order: FIFO admission from ``_waiting``, O(1) abort from both.
        self._waiting: dict[str, _Sequence] = {}
        self._running: dict[str, _Sequence] = {}

    def add(self, request: EngineRequest) -> None:
        if request.request_id in self._waiting or request.request_id in self._running:
            raise ValueError(f"request {request.request_id!r} is already in the engine")
        if request.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        in_vocabulary = all(0 <= token_id < FAKE_VOCAB_SIZE for token_id in request.prompt_token_ids)
        self._waiting[request.request_id] = _Sequence(
            request, self._start_offset(request), request.resumed_tokens, in_vocabulary
        )

    def abort(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)
        self._running.pop(request_id, None)

    def step(self) -> list[SequenceUpdate]:
        self._admit_waiting()
        if not self._running:
            return []
        if self._step_delay_s > 0:
            time.sleep(self._step_delay_s)  # stands in for the forward pass
        updates = [self._advance(sequence) for sequence in self._running.values()]
        for update in updates:
            if update.is_finished:
                del self._running[update.request_id]
        return updates

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._running), waiting=len(self._waiting))  # no KV cache

    def close(self) -> None:
        self._waiting.clear()
        self._running.clear()

    def _admit_waiting(self) -> None:
        while self._waiting and len(self._running) < self._max_batch_size:
            # The most urgent priority first, FIFO within it (min() keeps the first of equals).
            request_id = min(self._waiting, key=lambda waiting_id: self._waiting[waiting_id].request.priority)
            self._running[request_id] = self._waiting.pop(request_id)

    def _start_offset(self, request: EngineRequest) -> int:
        if request.sampling.is_greedy:
            return 0
        if request.sampling.seed is not None:
            key = str(request.sampling.seed).encode()
        else:
            key = ",".join(map(str, request.prompt_token_ids[: output_start(request)])).encode()
        return zlib.crc32(key) % len(self._script)

    def _advance(self, sequence: _Sequence) -> SequenceUpdate:
        request = sequence.request
        if not sequence.in_vocabulary:
            return failed_update(request.request_id)  # a model's embedding lookup would raise here
        token_id = self._next_token(sequence)
        is_first = sequence.generated == 0
        sequence.generated += 1
        if token_id in request.eos_token_ids:
            finish_reason: FinishReason | None = FinishReason.STOP
        elif sequence.generated >= request.max_new_tokens:
            finish_reason = FinishReason.LENGTH
        else:
            finish_reason = None
        return SequenceUpdate(
            request.request_id,
            (token_id,),
            finish_reason,
            logprobs=None if request.logprobs is None else (fake_score(token_id, request.logprobs),),
            prompt_logprobs=_fake_prompt_scores(request) if is_first else None,
        )

    def _next_token(self, sequence: _Sequence) -> int:
        request = sequence.request
        eos_allowed_from = max(len(self._script), request.sampling.min_new_tokens)
        if request.eos_token_ids and sequence.generated >= eos_allowed_from:
            # Prefer the fake's own EOS; a request naming other EOS ids still gets one of its own.
            return EOS_TOKEN_ID if EOS_TOKEN_ID in request.eos_token_ids else min(request.eos_token_ids)
        return self._script[(sequence.offset + sequence.generated) % len(self._script)]


def fake_score(token_id: int, top: int) -> TokenScore:
    """The fake's logprob of ``token_id`` (always the most likely token) and ``top`` alternatives."""
    logprob = -0.1 * (1 + token_id % 5)
    alternatives = [(token_id, logprob)] + [
        ((token_id + rank) % BYTE_VOCAB_SIZE, logprob - rank) for rank in range(1, top)
    ]
    return TokenScore(token_id, logprob, tuple(alternatives[:top]))


def _fake_prompt_scores(request: EngineRequest) -> tuple[TokenScore | None, ...] | None:
    if request.prompt_logprobs is None:
        return None
    rest = (fake_score(token_id, request.prompt_logprobs) for token_id in request.prompt_token_ids[1:])
    return (None, *rest)
