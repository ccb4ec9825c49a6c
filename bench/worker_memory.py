"""How much memory a serving system's engine process holds under load, against what it must hold.

Starts one system as ``bench.peers`` does (the bundled model, ``--dtype``, ``--max-model-len
2048``; ``native``, ``vllm-engine`` or ``vllm``), sends its warm-up request, then one level of
streamed chat requests (``--concurrency``, ``--requests``, 64 forced tokens each). Meanwhile,
every ``--interval-ms``, it reads the resident memory (``VmRSS``) of the process that runs the
model and of its children (tokenferry's worker; vLLM's API server and its engine core), and
from a tokenferry worker the KV-cache tokens it holds (``kv_cache_held_tokens`` and
``prefix_cache_held_tokens``). It reports:

- ``idle_mb``: resident after the warm-up; ``peak_mb``: the most seen during the level;
  ``settled_mb``: resident ``SETTLE_S`` after the level (a worker trims freed memory after 2 s
  idle);
- ``weights_mb``: the checkpoint's parameters at the dtype; ``kv_mb_at_peak``: the KV the
  worker held at the sample of the peak (running rows and the prefix cache), from the model's
  layers x KV heads x head size;
- ``runtime_mb``: a process that has imported the worker's code, torch and transformers and
  loaded nothing, which every worker carries whatever the model;
- ``peak_over_needed``: peak / (weights + KV at the peak), and ``above_runtime_over_needed``:
  (peak - runtime) / (weights + KV at the peak).

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.worker_memory --dtype float32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import load
from bench.peers.memory import MB, Sample, Sampler
from bench.peers.options import OUTPUT_TOKENS
from bench.peers.runner import WARM_UP_TIMEOUT_S, bundled_model_dir
from bench.peers.shares import DTYPE_BYTES, parameter_count
from bench.peers.systems import REPOSITORY, Endpoint, SystemSetup, running_system

SETTLE_S = 4.0
# What a worker imports before it loads a model; its resident size is the runtime's.
_RUNTIME_PROBE = (
    "import psutil, torch, transformers, worker.main, worker.model.backend, worker.engine.hf\n"
    "print(psutil.Process().memory_info().rss)"
)


def kv_bytes_per_token(model_dir: Path, dtype: str) -> int:
    """Keys and values of one token across the layers: layers x 2 x KV heads x head size x dtype."""
    config = json.loads((model_dir / "config.json").read_text())
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return int(config["num_hidden_layers"]) * 2 * int(heads) * int(head_dim) * DTYPE_BYTES[dtype]


def runtime_bytes(python: str) -> int:
    """Resident bytes of a process that imported what a worker imports, and loaded no model."""
    output = subprocess.run(
        [python, "-c", _RUNTIME_PROBE],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return int(output.split()[-1])


@dataclass(frozen=True)
class MemoryReport:
    system: str
    dtype: str
    concurrency: int
    requests: int
    output_tokens_per_s: float
    idle_mb: float
    peak_mb: float
    settled_mb: float
    weights_mb: float
    kv_mb_at_peak: float | None
    runtime_mb: float
    peak_over_needed: float | None
    above_runtime_over_needed: float | None


def report(
    endpoint: Endpoint,
    *,
    idle: Sample,
    samples: list[Sample],
    settled: Sample,
    weights: int,
    kv_token_bytes: int,
    runtime: int,
    level: load.LevelRun,
    concurrency: int,
) -> MemoryReport:
    peak = max(samples, key=lambda sample: sample.rss, default=idle)
    kv = None if peak.kv_tokens is None else peak.kv_tokens * kv_token_bytes
    needed = None if kv is None else weights + kv
    tokens = sum(record.tokens for record in level.records)
    return MemoryReport(
        system=endpoint.system,
        dtype=endpoint.dtype,
        concurrency=concurrency,
        requests=len(level.records),
        output_tokens_per_s=round(tokens / level.wall_s, 1) if level.wall_s > 0 else 0.0,
        idle_mb=round(idle.rss / MB),
        peak_mb=round(peak.rss / MB),
        settled_mb=round(settled.rss / MB),
        weights_mb=round(weights / MB),
        kv_mb_at_peak=None if kv is None else round(kv / MB),
        runtime_mb=round(runtime / MB),
        peak_over_needed=None if needed is None else round(peak.rss / needed, 2),
        above_runtime_over_needed=None if needed is None else round((peak.rss - runtime) / needed, 2),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--system", default="native", choices=("native", "vllm-engine", "vllm"))
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPE_BYTES))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.chdir(REPOSITORY)
    model_dir = bundled_model_dir()
    weights = parameter_count(model_dir) * DTYPE_BYTES[args.dtype]
    python = args.vllm_python if args.system != "native" else sys.executable
    runtime = runtime_bytes(python if Path(python).is_absolute() else str(REPOSITORY / python))
    setup = SystemSetup(model_dir, args.vllm_python, tuple(args.worker_arg))
    with running_system(args.system, args.dtype, setup) as endpoint:
        assert endpoint.engine_pid is not None
        asyncio.run(load.warm_up(endpoint.base_url, endpoint.model, WARM_UP_TIMEOUT_S))
        interval = args.interval_ms / 1000
        # Only the native engine reports the KV it holds; vLLM's engine keeps its own books.
        metrics_url = endpoint.worker_metrics_url if args.system == "native" else None
        sampler = Sampler(endpoint.engine_pid, metrics_url, interval)
        time.sleep(1.0)  # the warm-up's last publishes settle
        idle = sampler.now()
        with sampler:
            level = asyncio.run(
                load.run_level(
                    endpoint.base_url,
                    endpoint.model,
                    concurrency=args.concurrency,
                    requests=args.requests,
                    max_tokens=OUTPUT_TOKENS,
                    max_seconds=600,
                )
            )
        time.sleep(SETTLE_S)
        result = report(
            endpoint,
            idle=idle,
            samples=sampler.samples,
            settled=sampler.now(),
            weights=weights,
            kv_token_bytes=kv_bytes_per_token(model_dir, args.dtype),
            runtime=runtime,
            level=level,
            concurrency=args.concurrency,
        )
    print(json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    main()
