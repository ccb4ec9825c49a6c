"""The batched engine's decode throughput on one device, in-process: eager steps against captured ones.

For machines that hold no weights and can fetch none (the GPU machines lent to a
session reach no hub): the model is built from its architecture with random weights,
which cost the same to run as trained ones. Every request is greedy and forced to its
full length, so the work does not depend on what the weights say. Each system runs every
level with the same engine (its graphs or compiled buckets are made once, at start-up,
and that time is reported apart).

    python -m bench.device_engine --device cuda --dtype bfloat16 --levels 1,8,32,64
    python -m bench.device_engine --device cpu --dtype float32 --levels 1,8 --systems eager

Systems: ``eager`` (one eager forward per step), ``graphs`` (CUDA graphs of the decode
step, ``graphed_decode.py``; CUDA only), ``compiled`` (``--compile``'s inductor buckets).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

ARCHITECTURES: dict[str, dict[str, Any]] = {
    # SmolLM2-135M, the bundled model.
    "smollm2-135m": {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "rope_theta": 100000.0,
    },
    # Llama-3.2-1B's shapes: a model a GPU is bought for.
    "llama-1b": {
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
    },
}


def build_model(architecture: str, device: str, dtype: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**ARCHITECTURES[architecture])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    return model.eval()


def build_engine(model: Any, system: str, max_rows: int) -> tuple[Any, float]:
    """The engine for ``system`` and the seconds its start-up (compile or capture) took."""
    from worker.engine.hf import TransformersEngine
    from worker.engine.scheduler import BatchLimits

    limits = BatchLimits(max_batch_size=max_rows, max_batch_tokens=1 << 22, max_prefill_tokens=4096)
    engine = TransformersEngine(
        model,
        limits,
        prefix_cache_tokens=0,
        compile_options={} if system == "compiled" else None,
        cuda_graphs=system == "graphs",
    )
    started = time.perf_counter()
    engine.compile_decode()
    return engine, time.perf_counter() - started


def run_level(
    engine: Any, concurrency: int, prompt_tokens: int, new_tokens: int, seed: int
) -> dict[str, Any]:
    """``concurrency`` requests added at once and stepped to the end: tok/s and the decode step's p50."""
    import torch

    from worker.engine import EngineRequest, SamplingParams

    rng = random.Random(seed)
    for index in range(concurrency):
        prompt = tuple(rng.randrange(100, 20000) for _ in range(prompt_tokens))
        engine.add(EngineRequest(f"r{index}", prompt, SamplingParams(), new_tokens, frozenset()))
    steps: list[tuple[float, int]] = []
    tokens = 0
    started = time.perf_counter()
    while engine.has_unfinished():
        step_started = time.perf_counter()
        produced = sum(len(update.new_token_ids) for update in engine.step())
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        steps.append((time.perf_counter() - step_started, produced))
        tokens += produced
    wall = time.perf_counter() - started
    decode = [seconds for seconds, produced in steps if produced == concurrency]
    return {
        "concurrency": concurrency,
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "decode_step_ms_p50": round(statistics.median(decode) * 1000, 2) if decode else None,
    }


def profile_decode(engine: Any, rows: int, prompt_tokens: int, steps: int = 10) -> str:
    """torch.profiler's table of ``steps`` decode steps of ``rows`` rows (host and device time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from worker.engine import EngineRequest, SamplingParams

    rng = random.Random(rows)
    for index in range(rows):
        prompt = tuple(rng.randrange(100, 20000) for _ in range(prompt_tokens))
        engine.add(EngineRequest(f"p{index}", prompt, SamplingParams(), steps + 8, frozenset()))
    for _ in range(4):  # prefill, and a few steps to settle
        engine.step()
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiled:
        for _ in range(steps):
            engine.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    while engine.has_unfinished():
        engine.step()
    table: str = profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--architecture", default="smollm2-135m", choices=sorted(ARCHITECTURES))
    parser.add_argument("--systems", default="eager,graphs")
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--profile-rows", type=int, default=0, help="also profile 10 decode steps of this many rows"
    )
    args = parser.parse_args()

    import torch

    levels = [int(level) for level in args.levels.split(",")]
    model = build_model(args.architecture, args.device, args.dtype)
    with torch.inference_mode():
        results: dict[str, Any] = {
            "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
            "architecture": args.architecture,
            "dtype": args.dtype,
            "torch": torch.__version__,
            "systems": {},
        }
        for system in args.systems.split(","):
            engine, start_up = build_engine(model, system, max(levels))
            run_level(engine, 2, 16, 4, seed=1)  # warm: first forwards allocate
            rows = [run_level(engine, c, args.prompt_tokens, args.new_tokens, seed=c) for c in levels]
            results["systems"][system] = {"start_up_s": round(start_up, 2), "levels": rows}
            for row in rows:
                print(
                    f"{args.architecture} {args.dtype} {system:8s} c={row['concurrency']:3d}"
                    f" {row['tokens_per_s']:9.1f} tok/s  decode step p50 {row['decode_step_ms_p50']} ms"
                    f"  (start-up {start_up:.1f} s)",
                    flush=True,
                )
            if args.profile_rows:
                print(f"{system}: {args.profile_rows} rows, 10 decode steps", flush=True)
                print(profile_decode(engine, args.profile_rows, args.prompt_tokens), flush=True)
            del engine
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
