"""Owns the in-process references: the same model and prompts through plain transformers, no server.

Three baselines frame the gateway's numbers, all on the model as loaded, with
plain transformers layers:

- ``naive``: one request at a time through ``model.generate`` (a server with no
  batching at all); the floor a serving stack must beat.
- ``static_batch``: ``model.generate`` on one left-padded batch of C prompts, all
  decoded in lock-step; the ceiling for C requests that arrive together, with
  no HTTP, Redis, scheduling or detokenization cost.
- ``continuous_batching``: transformers' own ``model.generate_batch`` (paged KV
  cache, its own scheduler) on the same C prompts; a failure is reported, not raised.

One more runs what the worker runs, on a second copy of the model set up as the
worker sets it up (``load_engine_model``: Linear layers packed for oneDNN when the
worker would pack them) and the engine as the worker builds it (``worker_engine``,
prefix cache on):

- ``engine``: tokenferry's own batched engine (``worker.engine.hf``) stepped in
  this process on the same C prompts: its efficiency against the static batch,
  apart from what HTTP, Redis and a shared machine cost the served numbers.

The in-process prefill reference, which the served C=1 TTFT is compared with, runs on
such a copy too, but is measured between the served C=1 requests: ``bench.prefill``.

All decode greedily and exactly ``output_tokens`` tokens: ``min_new_tokens``
suppresses EOS for ``generate``, ``generate_batch`` gets ``eos_token_id=None``,
which its manager turns into -1 (no EOS), and engine requests get no EOS ids.
Prompts are padded by hand (left, with the pad token or else EOS) rather than by
mutating the tokenizer's ``padding_side``. ``max_time`` (transformers' ``MaxTimeCriteria``) caps each static
batch, and the naive requests together, at ``--max-seconds-per-level``. ``generate_batch`` has no such
cap, so a size whose static batch was already capped is skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from worker.engine import EngineRequest
    from worker.engine.hf import TransformersEngine
    from worker.model.loading import LoadedModel


def load_reference_model() -> LoadedModel:
    """The worker's own loader with default settings: the bundled model on CPU, as the worker loads it."""
    from transformers.utils import logging as hf_logging

    from shared.settings import WorkerSettings
    from worker.model.loading import load_model

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers leaves it untyped
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    # generate_batch warns that eos_token_id=None means "no EOS", which is what we ask for.
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
    return load_model(WorkerSettings())


def load_engine_model() -> LoadedModel:
    """Another copy of the model, set up as the worker sets it up (``backend.prepare_model``: fused
    projections, Linear layers packed for oneDNN where the settings ask and the model allows)."""
    from shared.settings import WorkerSettings
    from worker.model.backend import prepare_model

    loaded = load_reference_model()
    prepare_model(loaded.model, WorkerSettings())
    return loaded


def _pad_id(loaded: LoadedModel) -> int:
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad)


def _left_padded(prompts: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    width = max(len(ids) for ids in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in prompts])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts])
    return input_ids, attention_mask


def _generate(loaded: LoadedModel, prompts: Sequence[list[int]], new_tokens: int, max_time: float) -> int:
    """Decode ``new_tokens`` greedy tokens for every prompt in one batch; return the tokens produced."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(  # type: ignore[no-untyped-call]  # transformers leaves it untyped
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        max_time=max_time,
        pad_token_id=_pad_id(loaded),
        eos_token_id=loaded.tokenizer.eos_token_id,
    )
    input_ids, attention_mask = _left_padded(prompts, _pad_id(loaded))
    with torch.inference_mode():
        output = loaded.model.generate(  # type: ignore[operator]  # nn.Module's __getattr__ hides it
            input_ids=input_ids.to(loaded.device),
            attention_mask=attention_mask.to(loaded.device),
            generation_config=config,
        )
    return int(output.shape[1] - input_ids.shape[1]) * len(prompts)


def warm_up(loaded: LoadedModel, prompt: list[int]) -> None:
    """A few untimed steps: the first forward passes allocate and are slow."""
    _generate(loaded, [prompt], 4, max_time=60.0)


def naive(
    loaded: LoadedModel, prompts: Sequence[list[int]], new_tokens: int, max_time: float
) -> dict[str, Any]:
    """One request at a time, back to back, until done or ``max_time`` has passed in all."""
    deadline = time.perf_counter() + max_time
    latencies: list[float] = []
    tokens = 0
    for prompt in prompts:
        started = time.perf_counter()
        if started >= deadline:
            break
        tokens += _generate(loaded, [prompt], new_tokens, deadline - started)
        latencies.append(time.perf_counter() - started)
    total = sum(latencies)
    return {
        "requests": len(latencies),
        "output_tokens": tokens,
        "wall_s": round(total, 3),
        "output_tokens_per_s": round(tokens / total, 2),
        "request_latency_s_mean": round(total / len(latencies), 3),
        "partial": tokens < new_tokens * len(prompts),
    }


def static_batch(
    loaded: LoadedModel, prompts: Sequence[list[int]], new_tokens: int, max_time: float
) -> dict[str, Any]:
    """All prompts in one left-padded ``generate`` call."""
    started = time.perf_counter()
    tokens = _generate(loaded, prompts, new_tokens, max_time)
    return {**_rate(len(prompts), tokens, started), "partial": tokens < new_tokens * len(prompts)}


def continuous_batching(loaded: LoadedModel, prompts: Sequence[list[int]], new_tokens: int) -> dict[str, Any]:
    """``model.generate_batch`` on all prompts; any failure becomes the ``error`` field."""
    from transformers import GenerationConfig

    config = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False, max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=_pad_id(loaded)
    )
    started = time.perf_counter()
    try:
        results = loaded.model.generate_batch(  # type: ignore[operator]
            inputs=[list(ids) for ids in prompts], generation_config=config
        )
    except Exception as error:  # report any backend failure (CPU support varies by version)
        return {"batch_size": len(prompts), "error": f"{type(error).__name__}: {error}"}
    wall = time.perf_counter() - started
    outputs = list(results.values())
    tokens = sum(len(output.generated_tokens) for output in outputs)
    failures = [str(output.error) for output in outputs if output.error is not None]
    missing = len(prompts) - len(outputs)
    problem = f"{missing} results missing, {len(failures)} failed: {failures[:1]}"
    return {
        "batch_size": len(prompts),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2) if tokens else None,
        "short_sequences": sum(len(output.generated_tokens) < new_tokens for output in outputs),
        "error": problem if failures or missing else None,
    }


def worker_engine(loaded: LoadedModel, max_batch_size: int | None = None) -> TransformersEngine:
    """The batched engine with the worker's limits and prefix cache, as ``worker/model/backend.py`` has it."""
    from shared.settings import WorkerSettings
    from worker.engine.hf import TransformersEngine
    from worker.engine.scheduler import BatchLimits

    settings = WorkerSettings()
    limits = BatchLimits(
        max_batch_size or settings.max_batch_size, settings.kv_cache_tokens, settings.max_prefill_tokens
    )
    return TransformersEngine(loaded.model, limits, settings.prefix_cache_tokens)


def engine_request(request_id: str, prompt: Sequence[int], new_tokens: int) -> EngineRequest:
    """A greedy request; no EOS ids force the full length (the server's ``ignore_eos``)."""
    from worker.engine import EngineRequest, SamplingParams

    return EngineRequest(request_id, tuple(prompt), SamplingParams(), new_tokens, frozenset())


def engine(loaded: LoadedModel, prompts: Sequence[list[int]], new_tokens: int) -> dict[str, Any]:
    """tokenferry's batched engine, no server: all prompts added at once, stepped to the end.

    On the worker-configured model (``load_engine_model``) with the worker's prefix cache, so
    the number is what the worker runs.
    """
    batched = worker_engine(loaded, max_batch_size=len(prompts))
    for index, prompt in enumerate(prompts):
        batched.add(engine_request(f"r{index}", prompt, new_tokens))
    started = time.perf_counter()
    tokens = 0
    while batched.has_unfinished():
        tokens += sum(len(update.new_token_ids) for update in batched.step())
    return _rate(len(prompts), tokens, started)


def _rate(batch_size: int, tokens: int, started: float) -> dict[str, Any]:
    """The throughput fields every batched reference reports, timed from ``started``."""
    wall = time.perf_counter() - started
    return {
        "batch_size": batch_size,
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2),
    }
