"""Engine builders for tests: a tiny random-weight Llama (no hub) and request factories."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from worker.engine import Engine, EngineRequest, SamplingParams
from worker.engine.hf import TransformersEngine
from worker.engine.scheduler import BatchLimits

VOCAB = 128


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


def batched_engine(
    model: LlamaForCausalLM, prefix_cache_tokens: int = 0, **limits: int
) -> TransformersEngine:
    return TransformersEngine(model, BatchLimits(**limits), prefix_cache_tokens=prefix_cache_tokens)


def request(
    request_id: str,
    prompt: Sequence[int],
    max_new_tokens: int = 12,
    eos: Sequence[int] = (),
    **sampling: object,
) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
        max_new_tokens=max_new_tokens,
        eos_token_ids=frozenset(eos),
    )


def run_to_end(engine: Engine, requests: Sequence[EngineRequest]) -> dict[str, list[int]]:
    """Add all requests, step until done; each request's generated tokens."""
    produced: dict[str, list[int]] = {r.request_id: [] for r in requests}
    for r in requests:
        engine.add(r)
    while engine.has_unfinished():
        for update in engine.step():
            produced[update.request_id] += update.new_token_ids
    return produced
