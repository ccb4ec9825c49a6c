"""The worker's cache gauges on vLLM's engine come from its core's scheduler statistics
(``SchedulerCounts``), recorded at every core step without vLLM's own stat loggers."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.engines import request
from worker.engine import Engine

EngineFactory = Callable[[], Engine]
BLOCK = 128  # vLLM's KV block on CPU: its prefix cache reuses whole blocks
# Ids unlike any other test's, so the first run finds nothing cached: two whole blocks and a part.
PROMPT = tuple(range(5000, 5000 + 2 * BLOCK + 44))


@pytest.fixture(scope="module")
def make_engine() -> Iterator[EngineFactory]:
    from tests.vllm_engine import shared_vllm_engine

    with shared_vllm_engine(vllm_multiprocessing=True) as make:
        yield make


def test_the_cache_in_use_and_the_prefix_hits_reach_the_stats(make_engine: EngineFactory) -> None:
    engine = make_engine()
    before = engine.stats().prefix_cache_hit_tokens
    engine.add(request("first", PROMPT, max_new_tokens=4))
    in_use: list[int] = []
    while engine.has_unfinished():
        engine.step()
        in_use.append(engine.stats().kv_reserved_tokens)
    assert max(in_use) >= len(PROMPT)  # the prompt's blocks, while it ran
    assert engine.stats().kv_reserved_tokens == 0  # nothing running: nothing reserved
    assert engine.stats().prefix_cache_hit_tokens == before

    engine.add(request("again", PROMPT, max_new_tokens=4))
    while engine.has_unfinished():
        engine.step()
    assert engine.stats().prefix_cache_hit_tokens - before == 2 * BLOCK  # the whole blocks
