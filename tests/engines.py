"""Engine builders for tests: a tiny random-weight Llama (no hub), a faulty one, and request factories."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llguidance
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from worker.engine import Engine, EngineRequest, SamplingParams
from worker.engine.grammar import GrammarCompiler
from worker.engine.hf import TransformersEngine
from worker.engine.scheduler import BatchLimits

VOCAB = 128


def _tiny_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(_tiny_config()).eval()


class PoisonedLlama(LlamaForCausalLM):
    """The tiny Llama, except that a forward fed ``poison`` fails after its layers wrote the KV cache,
    as a fault late in a forward pass (a kernel, the LM head) would."""

    poison = -1

    def forward(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        output = super().forward(input_ids=input_ids, **kwargs)
        if input_ids is not None and bool((input_ids == self.poison).any()):
            raise RuntimeError("a poisoned forward")
        return output


def poisoned_llama(poison: int) -> PoisonedLlama:
    """``tiny_llama``'s weights (same seed, same config), failing on ``poison``."""
    torch.manual_seed(0)
    model = PoisonedLlama(_tiny_config()).eval()
    model.poison = poison
    return model


class ScriptedLlama(LlamaForCausalLM):
    """The tiny Llama, except that it strongly prefers ``script[k]`` as its k-th generated token
    (for prompts of ``prompt_len`` tokens): forced text where nothing masks it, its own choice after."""

    prompt_len = 0
    script: Sequence[int] = ()

    def forward(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        output = super().forward(input_ids=input_ids, **kwargs)
        for row, last in enumerate(kwargs["position_ids"][:, -1].tolist()):
            generated = last + 1 - self.prompt_len  # the index of the token these logits predict
            if 0 <= generated < len(self.script):
                output.logits[row, -1, self.script[generated]] += 1000.0
        return output


def scripted_llama(prompt_len: int, script: Sequence[int]) -> ScriptedLlama:
    """``tiny_llama``'s weights (same seed, same config), following ``script`` where it may."""
    torch.manual_seed(0)
    model = ScriptedLlama(_tiny_config()).eval()
    model.prompt_len, model.script = prompt_len, script
    return model


class ByteVocabulary:
    """What ``llguidance.TokenizerWrapper`` reads for the tiny model: id i is byte i, the last id is EOS."""

    def __init__(self) -> None:
        self.eos_token_id = VOCAB - 1
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(VOCAB - 1)] + [b"<eos>"]
        self.special_token_ids = [VOCAB - 1]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def byte_grammars() -> GrammarCompiler:
    """A grammar compiler for the tiny model's ids read as bytes (milliseconds per grammar)."""
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocabulary()), n_vocab=VOCAB)
    return GrammarCompiler(tokenizer)


def batched_engine(
    model: LlamaForCausalLM, prefix_cache_tokens: int = 0, use_cpu_kernels: bool = True, **limits: int
) -> TransformersEngine:
    return TransformersEngine(
        model,
        BatchLimits(**limits),
        prefix_cache_tokens=prefix_cache_tokens,
        use_cpu_kernels=use_cpu_kernels,
    )


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
    return run_with_failures(engine, requests)[0]


def run_with_failures(
    engine: Engine, requests: Sequence[EngineRequest]
) -> tuple[dict[str, list[int]], set[str]]:
    """Add all requests, step until done; each request's generated tokens, and the ids that failed."""
    produced: dict[str, list[int]] = {r.request_id: [] for r in requests}
    failed: set[str] = set()
    for r in requests:
        engine.add(r)
    while engine.has_unfinished():
        for update in engine.step():
            produced[update.request_id] += update.new_token_ids
            if update.failed:
                failed.add(update.request_id)
    return produced, failed


def sdpa_reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Attention as torch's sdpa computes it in fp32, grouped heads repeated.

    Shaped ``[rows, queries, heads, dim]``, as transformers' attention functions return it.
    """
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    output = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=mask
    )
    return output.transpose(1, 2)
