"""The warm-up a worker runs before it says it is ready: one short generation on the real engine."""

from __future__ import annotations

import pytest
from transformers import LlamaForCausalLM

from tests.engines import VOCAB, batched_engine, poisoned_llama, tiny_llama
from worker.engine.fake import ByteTokenizer
from worker.model.backend import Backend
from worker.model.warmup import WARM_UP_PROMPT, warm_up


def _backend(model: LlamaForCausalLM) -> Backend:
    # The prompt is ASCII: every byte is inside the tiny model's vocabulary.
    assert max(WARM_UP_PROMPT.encode()) < VOCAB
    return Backend(batched_engine(model), ByteTokenizer(), {}, 512, vocab_size=VOCAB)


def test_warm_up_runs_one_generation_through_prefill_and_decode_and_leaves_the_engine_empty() -> None:
    backend = _backend(tiny_llama())
    warm_up(backend)
    assert not backend.engine.has_unfinished()
    assert (backend.engine.stats().running, backend.engine.stats().waiting) == (0, 0)


def test_a_model_that_fails_its_warm_up_stops_the_worker_before_it_is_ready() -> None:
    backend = _backend(poisoned_llama(poison=ord(WARM_UP_PROMPT[0])))
    with pytest.raises(RuntimeError, match="warm-up"):
        warm_up(backend)
