"""Owns ``VllmEngine``: vLLM's ``LLMEngine`` driven through the ``Engine`` protocol.

vLLM's V1 engine loop is what the protocol was modelled on: ``add_request`` with
token ids, ``step`` returning each request's new tokens, ``abort_request``,
``has_unfinished_requests``. Its engine core runs in the worker's process on CPU, where
``step`` steps it, and otherwise in a child process (vLLM's default), which computes the
next step while the driver routes and publishes this one; there ``step`` only collects
what the core has produced, waiting for it (``launch._place_engine_core`` says why).

Requests keep tokenferry's ids: the driver's ids are vLLM's. Priorities map to
vLLM's ``priority`` scheduling (lower first: interactive before batch). A request
vLLM refuses at ``add`` (an id outside the vocabulary, a prompt too long for its
cache) comes back from the next ``step`` as a ``failed`` update, alone, as a
sequence the native engine cannot run does. A request counts as waiting until its
first token and as running after; the cache's use and prefix hits come from vLLM's
own scheduler statistics (``SchedulerCounts``).

With the core in a child, adds and aborts may run beside ``step`` (``concurrent_admission``): a request that
arrives while ``step`` waits for the core is sent to the core at once, as vLLM's own
server does, instead of one step later (+~100 ms TTFT at 32 streams, measured). ``step``
is ``LLMEngine.step`` split in two (``stepping.py``): the wait for the core's outputs
holds no lock; processing them, ``add`` and ``abort`` hold ``_lock``, since vLLM's output
processor and its input socket are not thread-safe. vLLM's input processor (a few
hundred µs per add) runs on the adding thread; torch stays in the engine-core process.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from worker.engine import EngineRequest, EngineStats, SequenceUpdate, failed_update
from worker.engine.vllm_adapter.outputs import update_of
from worker.engine.vllm_adapter.requests import prompt_of, sampling_params_of
from worker.engine.vllm_adapter.stepping import process_outputs, wait_for_outputs, waits_without_lock

logger = logging.getLogger(__name__)


class SchedulerCounts:
    """The latest scheduler statistics of vLLM's core: the cache's use and the prefix hits so far."""

    def __init__(self) -> None:
        self.kv_usage = 0.0
        self.prefix_hit_tokens = 0

    def record(self, scheduler_stats: Any) -> None:
        """Take one core step's ``SchedulerStats``."""
        self.kv_usage = float(scheduler_stats.kv_cache_usage)
        prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
        if prefix is not None:
            self.prefix_hit_tokens += int(prefix.hits)


class VllmEngine:
    """The ``Engine`` protocol over a built ``vllm.v1.engine.llm_engine.LLMEngine``."""

    # ``add`` and ``abort`` may run on another thread while ``step`` waits (``EngineDriver`` reads it).
    concurrent_admission: bool = True

    def __init__(self, engine: Any, model_eos: frozenset[int], kv_tokens: int) -> None:
        self._engine = engine
        self._counts = SchedulerCounts()
        self._model_eos = model_eos
        self._kv_tokens = kv_tokens
        self._requests: dict[str, EngineRequest] = {}
        self._started: set[str] = set()  # requests with a token out: running, not waiting
        self._refused: list[SequenceUpdate] = []  # what ``add`` could not hand to vLLM
        self._lock = threading.Lock()  # vLLM's output processor and input socket: one thread at a time
        self.concurrent_admission = waits_without_lock(engine)
        # An in-process core steps inside the wait: then nothing may run beside it.
        self._wait_guard: AbstractContextManager[Any] = (
            nullcontext() if self.concurrent_admission else self._lock
        )

    def add(self, request: EngineRequest) -> None:
        with self._lock:
            try:
                self._engine.add_request(
                    request.request_id,
                    prompt_of(request),
                    sampling_params_of(request, self._model_eos),
                    priority=request.priority,
                )
            except Exception:  # vLLM validates a prompt and its parameters in add_request
                logger.exception("vLLM refused sequence %s; failing it alone", request.request_id)
                self._refused.append(failed_update(request.request_id))
                return
            self._requests[request.request_id] = request

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._refused = [update for update in self._refused if update.request_id != request_id]
            self._started.discard(request_id)
            if self._requests.pop(request_id, None) is not None:
                self._engine.abort_request([request_id])

    def step(self) -> list[SequenceUpdate]:
        with self._lock:
            updates, self._refused = self._refused, []
        # vLLM's core steps on its own; one batch of its outputs may move nothing yet (the core
        # still prefilling, or only statistics): wait for one that moved a sequence. With nothing
        # in flight the wait would never end. A request aborted during the wait still ends it:
        # the core runs one more step to drop it, and with statistics on (``launch.py``) every
        # core step sends outputs.
        while self._requests:
            with self._wait_guard:
                outputs = wait_for_outputs(self._engine)
            with self._lock:
                progress = self._collect(process_outputs(self._engine, outputs, self._counts.record))
            updates += progress
            if progress:
                break
        return updates

    def _collect(self, outputs: list[Any]) -> list[SequenceUpdate]:
        updates: list[SequenceUpdate] = []
        for output in outputs:
            request = self._requests.get(output.request_id)
            if request is None:  # aborted while the core was computing it
                continue
            update = update_of(output, request, first=output.request_id not in self._started)
            self._started.add(output.request_id)
            if output.finished:
                del self._requests[output.request_id]
                self._started.discard(output.request_id)
                if update.finish_reason is None:  # vLLM ended it for a reason of its own
                    logger.warning("vLLM ended request %s without stop or length", output.request_id)
                    update = failed_update(output.request_id)
            elif not update.new_token_ids:
                continue
            updates.append(update)
        return updates

    def has_unfinished(self) -> bool:
        return bool(self._requests or self._refused)

    def stats(self) -> EngineStats:
        # Read without the lock, beside an add: each ``len`` is atomic, and a count off by the
        # request being added only shifts a gauge.
        counts = self._counts
        running = len(self._started)
        return EngineStats(
            running=running,
            waiting=max(0, len(self._requests) - running),
            kv_reserved_tokens=int(counts.kv_usage * self._kv_tokens) if self._requests else 0,
            kv_capacity_tokens=self._kv_tokens,
            prefix_cache_hit_tokens=counts.prefix_hit_tokens,
        )

    def close(self) -> None:
        with self._lock:
            self._requests.clear()
            self._started.clear()
            self._refused.clear()
        shutdown = getattr(self._engine.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()
