"""vLLM's engine for the contract tests: started once per module (a start takes a minute or more),
each test getting a view whose ``close`` ends only that test's requests."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from shared.settings import WorkerSettings
from worker.engine import Engine, EngineRequest, EngineStats, SequenceUpdate
from worker.engine.vllm_adapter.launch import CORE_PLACEMENT
from worker.model.backend import load_backend


class EngineView:
    """The shared engine as one test sees it: ``close`` aborts what it added instead of stopping vLLM."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._added: list[str] = []
        self.concurrent_admission = bool(getattr(engine, "concurrent_admission", False))

    def add(self, request: EngineRequest) -> None:
        self._added.append(request.request_id)
        self._engine.add(request)

    def abort(self, request_id: str) -> None:
        self._engine.abort(request_id)

    def step(self) -> list[SequenceUpdate]:
        return self._engine.step()

    def has_unfinished(self) -> bool:
        return self._engine.has_unfinished()

    def stats(self) -> EngineStats:
        return self._engine.stats()

    def close(self) -> None:
        for request_id in self._added:
            self._engine.abort(request_id)


@contextmanager
def shared_vllm_engine(**settings: object) -> Iterator[Callable[[], Engine]]:
    """A factory of views of one vLLM engine on the bundled model, stopped on exit."""
    # Loading writes where the engine core runs into this process's environment, which every
    # process the tests start later would inherit: restored once the engine is up.
    placement = os.environ.get(CORE_PLACEMENT)
    try:
        backend = load_backend(
            WorkerSettings(engine="vllm", max_batch_size=8, cpu_kvcache_space_gb=1, **settings)
        )
    finally:
        if placement is None:
            os.environ.pop(CORE_PLACEMENT, None)
        else:
            os.environ[CORE_PLACEMENT] = placement
    try:
        yield lambda: EngineView(backend.engine)
    finally:
        backend.engine.close()
