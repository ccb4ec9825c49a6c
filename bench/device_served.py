"""Streamed chat through a gateway, Redis and one worker on a given device: tok/s and TTFT per level.

The served counterpart of ``bench.device_engine``, for machines where ``make bench-peers``
cannot run (a GPU machine has no vLLM CPU build to compare against, no model and no hub).
Each system is one worker configuration; every level is a closed loop of C streaming
clients (``bench.load``), greedy, ``--max-tokens`` forced tokens, N = max(16, 4·C).

    python -m bench.device_served --model DIR --systems graphs,eager --levels 1,8,32,64
    python -m bench.device_served --random-weights-from DIR ...   # DIR's config and tokenizer

``--random-weights-from`` writes a copy of DIR's architecture with random weights (bf16) and
DIR's tokenizer files to a temporary directory and serves that: the same work as the trained
weights, for a machine that holds none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.load import run_level, warm_up
from bench.servers import running_servers
from bench.stats import summarize_level

# A system is the worker's flags beyond the model.
SYSTEMS = {"graphs": [], "eager": ["--enforce-eager"]}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def random_weights_copy(source: Path) -> Path:
    """A directory with ``source``'s config and tokenizer and random bf16 weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    target = Path(tempfile.mkdtemp(prefix="tokenferry-random-"))
    config = AutoConfig.from_pretrained(source)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    return target


async def _levels(base_url: str, model: str, levels: list[int], max_tokens: int) -> list[dict[str, Any]]:
    await warm_up(base_url, model, timeout_s=300.0)
    rows = []
    for concurrency in levels:
        run = await run_level(
            base_url,
            model,
            concurrency=concurrency,
            requests=max(16, 4 * concurrency),
            max_tokens=max_tokens,
            max_seconds=180.0,
        )
        rows.append({"concurrency": concurrency, **summarize_level(run.records, run.wall_s, max_tokens)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path)
    source.add_argument("--random-weights-from", type=Path)
    parser.add_argument("--systems", default="graphs,eager")
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeat)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    model_dir = args.model or random_weights_copy(args.random_weights_from)
    levels = [int(level) for level in args.levels.split(",")]
    results: dict[str, Any] = {"model_dir": str(model_dir), "systems": {}}
    for system in args.systems.split(","):
        worker_args = ["--model", str(model_dir), "--max-batch-size", str(max(levels))]
        worker_args += SYSTEMS[system] + args.worker_arg
        with running_servers(worker_args) as servers:
            rows = asyncio.run(_levels(servers.base_url, servers.model, levels, args.max_tokens))
        results["systems"][system] = {"worker_args": worker_args, "levels": rows}
        for row in rows:
            print(
                f"{system:7s} c={row['concurrency']:3d} {row['output_tokens_per_s']} tok/s"
                f"  TTFT p50 {row['ttft_ms_p50']} ms  TPOT p50 {row['tpot_ms_p50']} ms"
                f"  errors {row['errors']} short {row['short_requests']}",
                flush=True,
            )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
