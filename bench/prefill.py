"""Owns the in-process prefill reference: the served C=1 TTFT without HTTP, Redis, queue or streaming.

It runs what the worker runs: a copy of the model set up as the worker sets it up
(``references.load_engine_model``) and the engine as the worker builds it
(``references.worker_engine``, prefix cache on). The server's unmeasured warm-up
request (``load.WARM_UP_PROMPT``, ``WARM_UP_TOKENS``) runs first, to its end, so the
chat template's shared prefix is in the prefix cache, as it is in the server. Each
C=1 prompt is then timed from ``add`` to the ``step()`` that returns its first token,
and run to its end before the next, so later prompts find the earlier ones cached,
as they do in the server.

Why it is measured interleaved with the served C=1 level: this 2-core VM drifts by
10-20 % from one minute to the next, and when the reference ran in the references
phase, minutes before the servers started, "served TTFT p50 minus prefill p50" swung
between +6.7 and +29.5 ms across runs of the same code. Now ``bench.load.run_level``
calls ``PrefillReference.measure(i)`` after the served request ``i`` has ended and
before request ``i + 1`` is sent, so the servers are idle while it runs and each pair
is measured seconds apart; the median of the per-request differences is reported beside
the difference of the medians. With ``--skip-server`` there is no served level to pair
with, and ``measure_alone`` runs the same prompts one after another (``paired: false``).

``--max-seconds-per-level`` caps the reference's own time, not the served requests'
between its runs: once spent, it starts no new request, and its line says ``partial``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench.load import WARM_UP_PROMPT, WARM_UP_TOKENS
from bench.prompts import render_prompt_ids, user_prompt
from bench.references import engine_request, worker_engine
from bench.stats import RequestRecord, percentile

if TYPE_CHECKING:
    from worker.engine import EngineRequest
    from worker.engine.hf import TransformersEngine
    from worker.model.loading import LoadedModel


def _first_token_s(batched: TransformersEngine, request: EngineRequest) -> float | None:
    """Seconds from ``add`` to the ``step`` returning the request's first token; it then runs to its end."""
    started = time.perf_counter()
    batched.add(request)
    first: float | None = None
    while batched.has_unfinished():
        updates = batched.step()
        if first is None and any(update.new_token_ids for update in updates):
            first = time.perf_counter() - started
    return first


class PrefillReference:
    """The worker's engine after the server's warm-up request, timing the C=1 prompts one at a time."""

    def __init__(
        self, loaded: LoadedModel, first_prompt: int, requests: int, new_tokens: int, max_time: float
    ) -> None:
        self._engine = worker_engine(loaded)
        self._prompts = [
            render_prompt_ids(loaded.tokenizer, user_prompt(first_prompt + i)) for i in range(requests)
        ]
        self._new_tokens = new_tokens
        self._max_time = max_time
        self._spent_s = 0.0
        self._dropped = 0
        self.prefill_ms: dict[int, float] = {}  # by request index, as the served level numbers them
        warm_up = render_prompt_ids(loaded.tokenizer, WARM_UP_PROMPT)
        _first_token_s(self._engine, engine_request("warm-up", warm_up, WARM_UP_TOKENS))

    def measure(self, index: int) -> None:
        """Time the ``index``-th C=1 prompt to its first token, then run it to its end; not once capped."""
        if self._spent_s >= self._max_time:
            self._dropped += 1
            return
        started = time.perf_counter()
        request = engine_request(f"p{index}", self._prompts[index], self._new_tokens)
        seconds = _first_token_s(self._engine, request)
        self._spent_s += time.perf_counter() - started
        if seconds is not None:  # always set: every request asks for at least one token
            self.prefill_ms[index] = seconds * 1000.0

    def fields(self) -> dict[str, Any]:
        """The ``reference_prefill`` line's measurements, paired or not."""
        measured = list(self.prefill_ms.values())
        prompt_tokens = [len(self._prompts[index]) for index in self.prefill_ms]
        return {
            "requests": len(measured),
            "prefill_ms_p50": _round(percentile(measured, 50)),
            "prefill_ms_min": _round(min(measured, default=None)),
            "prefill_ms_max": _round(max(measured, default=None)),
            "prompt_tokens_mean": round(sum(prompt_tokens) / len(prompt_tokens), 1)
            if prompt_tokens
            else None,
            "partial": self._dropped > 0,
        }


def measure_alone(
    loaded: LoadedModel, first_prompt: int, requests: int, new_tokens: int, max_time: float
) -> dict[str, Any]:
    """The C=1 prompts one after another with no served level between them (``--skip-server``)."""
    reference = PrefillReference(loaded, first_prompt, requests, new_tokens, max_time)
    for index in range(requests):
        reference.measure(index)
    return {**reference.fields(), "paired": False}


def paired_fields(reference: PrefillReference, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The line of a reference measured between the served requests: its numbers, plus each
    request's served TTFT beside its in-process prefill (only where both were measured)."""
    pairs = [
        {"request": record.index, "ttft_ms": round(ttft * 1000.0, 2), "prefill_ms": round(prefill_ms, 2)}
        for record in sorted(records, key=lambda record: record.index)
        if record.error is None
        and (ttft := record.ttft_s) is not None
        and (prefill_ms := reference.prefill_ms.get(record.index)) is not None
    ]
    return {**reference.fields(), "paired": True, "pairs": pairs}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
