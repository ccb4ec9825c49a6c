"""Where one decode step of the served native engine goes: forward (Linears, LM head, attention,
KV writes, the rest), sampling and accepting, in-process, timed around each.

The engine is loaded by the worker's own loader (``load_backend``) with the settings a served
worker gets from ``bench.peers`` (the bundled model, ``--dtype``, ``--max-model-len 2048``,
every default else), and ``--rows`` chat requests of the bench's prompts run to 64 forced
tokens each, as ``bench.peers`` sends them. After the prefills and a few steps to settle:

- timers: each phase wrapped in ``perf_counter`` (the forward; in it the packed Linears, the
  LM head told apart by its vocabulary-wide output, the decode attention kernel (where the
  direct forward makes it one call per layer, with the rotation and KV writes), the KV
  cache's writes; then sampling and accepting), summed over ``--steps`` steps;
- with ``--table``, torch.profiler's op table over 10 more steps (the CPU kernels' calls are
  not ops and are missing from it).

Routing and publishing happen on the worker's event loop between steps, not here: served
runs time them (``tokenferry_worker_route_duration_seconds`` and
``..._publish_duration_seconds``), and ``bench.peers`` reports them as ``route_share`` and
``publish_share`` in its JSON.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.step_profile --dtype float32 --rows 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

NEW_TOKENS = 64
MAX_MODEL_LEN = 2048


class PhaseTimes:
    """Seconds per phase, summed while ``enabled``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.enabled = False

    def wrap(self, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return function(*args, **kwargs)
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - started

        return timed


class _TimedKernels:
    """The CPU kernels with ``decode_attention`` timed; every other kernel as it is."""

    def __init__(self, kernels: Any, times: PhaseTimes) -> None:
        self._kernels = kernels
        self.decode_attention = times.wrap("attention", kernels.decode_attention)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernels, name)


@contextmanager
def timed_phases(engine: Any, times: PhaseTimes) -> Iterator[None]:
    """Wrap the engine's phases in ``times`` (restored on exit)."""
    from worker.engine import decode_attention, hf
    from worker.engine.slot_cache import SlotKVCache
    from worker.model.onednn_linear import PackedLinear

    kernels = decode_attention.cpu_kernels.kernels()
    saved = (decode_attention.cpu_kernels.kernels, SlotKVCache.update, hf.sample_rows, hf.accept_rows)
    packed = PackedLinear.forward_packed, PackedLinear.forward_in_fp32
    vocab = engine._model.get_output_embeddings().out_features

    def linear(function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` timed as the LM head when its output is vocabulary-wide, else as the Linears."""
        head, other = times.wrap("LM head", function), times.wrap("Linears", function)
        return lambda self, hidden: (head if self.out_features == vocab else other)(self, hidden)

    PackedLinear.forward_packed = linear(PackedLinear.forward_packed)  # type: ignore[method-assign]
    PackedLinear.forward_in_fp32 = linear(PackedLinear.forward_in_fp32)  # type: ignore[method-assign]
    timed_kernels = _TimedKernels(kernels, times) if kernels is not None else None
    decode_attention.cpu_kernels.kernels = lambda: timed_kernels  # type: ignore[assignment]
    SlotKVCache.update = times.wrap("kv writes", SlotKVCache.update)  # type: ignore[method-assign]
    hf.sample_rows = times.wrap("sampling", hf.sample_rows)
    hf.accept_rows = times.wrap("accepting", hf.accept_rows)
    engine._decode_forward = times.wrap("forward", engine._decode_forward)
    # The direct forward's one-call attention (rotation, KV writes and attention: direct_forward.py).
    direct = getattr(engine, "_direct", None)
    one_call = None if direct is None else direct._append_and_attend
    if one_call is not None:
        direct._append_and_attend = times.wrap("attention", one_call)
    try:
        yield
    finally:
        if one_call is not None:
            direct._append_and_attend = one_call
        decode_attention.cpu_kernels.kernels, SlotKVCache.update, hf.sample_rows, hf.accept_rows = saved
        PackedLinear.forward_packed, PackedLinear.forward_in_fp32 = packed
        del engine._decode_forward


def _profile_table(engine: Any, steps: int) -> str:
    """torch.profiler's op table over ``steps`` steps (the CPU kernels' calls are not in it)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as run:
        for _ in range(steps):
            engine.step()
    table: str = run.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30, help="decode steps timed")
    parser.add_argument("--table", action="store_true", help="also print torch.profiler's op table")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from bench.peers.runner import bundled_model_dir
    from bench.prompts import render_prompt_ids, user_prompts
    from shared.settings import WorkerSettings
    from worker.engine import EngineRequest, SamplingParams
    from worker.model.backend import load_backend

    model_dir = bundled_model_dir()
    settings = WorkerSettings(model=str(model_dir), dtype=args.dtype, max_model_len=MAX_MODEL_LEN)
    engine = load_backend(settings).engine
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [render_prompt_ids(tokenizer, prompt) for prompt in user_prompts(args.rows)]
    for index, prompt in enumerate(prompts):
        request = EngineRequest(f"r{index}", tuple(prompt), SamplingParams(), NEW_TOKENS, frozenset())
        engine.add(request)
    while len(engine.step()) < args.rows:
        pass  # the prefills, until one step gives every row a token
    for _ in range(3):
        engine.step()
    times = PhaseTimes()
    steps: list[float] = []
    with torch.inference_mode(), timed_phases(engine, times):
        times.enabled = True
        for _ in range(args.steps):
            started = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - started)
    if args.table:
        print(_profile_table(engine, 10))
    while engine.has_unfinished():
        engine.step()

    count = len(steps)
    per_step = {phase: seconds / count * 1000 for phase, seconds in times.seconds.items()}
    step_ms = sum(steps) / count * 1000
    forward = per_step["forward"]
    one_call = getattr(engine, "_direct", None) is not None and engine._direct._append_and_attend is not None
    attention = "decode attention" + (", with the rotation and KV writes (one call)" if one_call else "")
    parts = sum(per_step.get(part, 0.0) for part in ("Linears", "LM head", "attention", "kv writes"))
    rows = [
        ("forward", forward),
        ("  Linears (oneDNN packed; QKV and gate/up fused)", per_step.get("Linears", 0.0)),
        ("  LM head", per_step.get("LM head", 0.0)),
        (f"  {attention}", per_step.get("attention", 0.0)),
        *([] if one_call else [("  KV writes", per_step.get("kv writes", 0.0))]),
        (f"  the rest (norms, {'' if one_call else 'rotation, '}silu*up, embedding)", forward - parts),
        ("sampling", per_step.get("sampling", 0.0)),
        ("accepting (tokens onto the rows)", per_step.get("accepting", 0.0)),
        ("the engine's own work", step_ms - forward - per_step.get("sampling", 0.0) - per_step["accepting"]),
    ]
    print(
        f"{args.dtype}, {args.rows} rows, {count} decode steps: mean {step_ms:.1f} ms,"
        f" p50 {statistics.median(steps) * 1000:.1f} ms (prompts {min(map(len, prompts))}-"
        f"{max(map(len, prompts))} tokens, 64 forced new tokens)"
    )
    print("| phase | ms per step | share of the step |\n| --- | --- | --- |")
    for name, milliseconds in rows:
        print(f"| {name} | {milliseconds:.2f} | {milliseconds / step_ms * 100:.1f} % |")


if __name__ == "__main__":
    main()
