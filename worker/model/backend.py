"""Owns the backend a worker serves with: the engine and tokenizer its settings name, and the model's limits.

The fake engine (tests, load tests) never imports torch; the transformers backend
loads the model (``worker/model/loading.py``) and picks the batched engine unless a
cache option only the per-sequence engine honours is set; the vllm backend starts
vLLM's engine (``worker/engine/vllm_adapter/``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.settings import WorkerSettings
from worker.engine import Engine
from worker.engine.grammar import GrammarCompiler
from worker.requests.tokenization import Tokenizer


@dataclass
class Backend:
    """What the settings name, loaded: the engine, its tokenizer and the model's limits."""

    engine: Engine
    tokenizer: Tokenizer
    generation_config: dict[str, Any]
    max_model_len: int
    vocab_size: int
    # Compiles constraints for the engine; None: the engine ignores them (the fake engine only).
    grammars: GrammarCompiler | None = None


def load_backend(
    settings: WorkerSettings, on_grammar_compile: Callable[[float], None] | None = None
) -> Backend:
    """Build the engine and tokenizer named by the settings (blocking: call off the loop).

    ``on_grammar_compile`` is told each grammar compile's duration in seconds (from preparation threads).
    """
    if settings.engine == "fake":
        from worker.engine.fake import FAKE_VOCAB_SIZE, ByteTokenizer, FakeEngine

        time.sleep(settings.fake_load_delay_s)  # stands in for loading weights
        engine = FakeEngine(
            settings.fake_script,
            step_delay_s=settings.fake_step_delay_s,
            max_batch_size=settings.max_batch_size,
        )
        return Backend(
            engine, ByteTokenizer(), {}, settings.max_model_len or 4096, vocab_size=FAKE_VOCAB_SIZE
        )
    if settings.engine == "vllm":
        from worker.engine.vllm_adapter.launch import load_vllm_backend

        return load_vllm_backend(settings, on_grammar_compile)
    return _load_transformers_backend(settings, on_grammar_compile)


def _load_transformers_backend(
    settings: WorkerSettings, on_grammar_compile: Callable[[float], None] | None
) -> Backend:
    # Imported here so fake-engine workers (tests, load tests) never pay for torch.
    import torch

    from worker.model.file_embedding import read_embedding_from_checkpoint
    from worker.model.freed_memory import release_mapped_weights, return_freed_memory
    from worker.model.loading import load_model
    from worker.model.onednn_linear import bound_primitive_caches
    from worker.requests.tokenization import HFTokenizer, load_chat_template

    bound_primitive_caches()  # before any oneDNN op of this process, loading's included
    loaded = load_model(settings)
    # torch's default is one thread per core. Leaving a core to the event loop, Redis and the
    # gateway used to pay while each queue poll cost the loop a round trip per running job;
    # since polls are cheap, all cores win (bench on 2 cores, 32 streams: 84 -> 117 tok/s).
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    prepare_model(loaded.model, settings)
    # After packing, which gave the LM head a copy of its own: the embedding is the lookup's alone.
    read_embedding_from_checkpoint(loaded.model, loaded.checkpoint)
    release_mapped_weights(loaded.model)  # the checkpoint's map, read whole by packing, leaves memory
    return_freed_memory()  # what loading and packing copied and freed (~300 MB for SmolLM2 in fp32)
    template = load_chat_template(settings.chat_template) if settings.chat_template else None
    eos = loaded.generation_config.get("eos_token_id")
    extra_eos = [eos] if isinstance(eos, int) else list(eos or [])
    tokenizer = HFTokenizer(loaded.tokenizer, chat_template=template, extra_eos_ids=extra_eos)
    engine = _build_engine(loaded.model, settings)
    vocab_size = int(loaded.model.config.vocab_size)
    grammars = _grammar_compiler(
        engine,
        loaded.tokenizer,
        vocab_size,
        tokenizer.eos_token_ids,
        on_grammar_compile,
        settings.grammar_tables_at_start,
    )
    return Backend(engine, tokenizer, loaded.generation_config, loaded.max_model_len, vocab_size, grammars)


def prepare_model(model: Any, settings: WorkerSettings) -> None:
    """The CPU hot path's model changes: fused input projections (unless compiled), then Linears
    packed for oneDNN (the fused ones too) where the settings ask and the build allows, then
    norms and gated MLPs in the CPU kernels (eager only; where they build)."""
    from worker.model.fused_projections import fuse_projections
    from worker.model.onednn_linear import can_pack, pack_linear_layers

    eager_cpu = not settings.compile and model.device.type == "cpu"
    if eager_cpu:
        fuse_projections(model)
    if settings.onednn_linear and can_pack(model):
        pack_linear_layers(model)
    if eager_cpu and settings.cpu_kernels:
        from worker.engine import cpu_kernels
        from worker.model.kernel_layers import use_kernel_layers

        use_kernel_layers(model, cpu_kernels.kernels())


def _grammar_compiler(
    engine: Engine,
    hf_tokenizer: Any,
    vocab_size: int,
    eos_token_ids: frozenset[int],
    on_compile: Callable[[float], None] | None,
    tables_at_start: bool,
) -> GrammarCompiler:
    """The batched engine's compiler; any other engine refuses constrained jobs rather than ignore them."""
    from worker.engine.hf import TransformersEngine

    if not isinstance(engine, TransformersEngine):
        return GrammarCompiler.unavailable_because(
            "structured outputs need the batched engine (not --disable-kv-cache or a static cache)"
        )
    return GrammarCompiler.for_hf_tokenizer(
        hf_tokenizer, vocab_size, eos_token_ids, on_compile, tables_at_start
    )


def _build_engine(model: Any, settings: WorkerSettings) -> Engine:
    """The batched engine, unless a cache option only the per-sequence engine honours is set."""
    import torch

    from worker.engine.hf import TransformersEngine
    from worker.engine.kv_cache import PaddedKVCache
    from worker.engine.scheduler import BatchLimits
    from worker.engine.sequential import SequentialEngine

    compile_options = settings.compile_args.model_dump() if settings.compile else None
    if (
        settings.disable_kv_cache
        or settings.cache_implementation == "static"
        or not PaddedKVCache.supports(model.config)
    ):
        if compile_options is not None:  # generate's own recipe: a static cache under a compiled forward
            model.forward = torch.compile(model.forward, **compile_options)
        return SequentialEngine(
            model,
            max_batch_size=settings.max_batch_size,
            cache_implementation=settings.cache_implementation,
            use_cache=not settings.disable_kv_cache,
        )
    limits = BatchLimits(settings.max_batch_size, settings.kv_cache_tokens, settings.max_prefill_tokens)
    engine = TransformersEngine(
        model,
        limits,
        settings.prefix_cache_tokens,
        compile_options,
        cuda_graphs=not settings.enforce_eager,
        use_cpu_kernels=settings.cpu_kernels,
    )
    engine.compile_decode()  # before the worker is ready: no request pays for a trace
    return engine
