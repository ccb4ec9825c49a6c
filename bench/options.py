"""Owns the benchmark's command-line flags and the immutable ``BenchOptions`` they become.

``--quick`` is a preset (concurrency 1,8 and 32 output tokens); flags given
explicitly beat it. The default run is sized for about 11 minutes on 2 CPU
cores: ``--max-seconds-per-level`` caps every sweep level and every static-batch
reference, and a capped measurement says so in its JSON line (``partial``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_CONCURRENCY = (1, 8, 32, 64)
QUICK_CONCURRENCY = (1, 8)
DEFAULT_OUTPUT_TOKENS = 64
QUICK_OUTPUT_TOKENS = 32
# 64 sequential requests x 64 tokens at ~12 tok/s is ~340 s; 150 s keeps the default run near 10 min.
DEFAULT_MAX_SECONDS_PER_LEVEL = 150.0
# C=1 sends several requests, one after another, so its TTFT p50 is a median rather than one sample
# (and so is the paired in-process prefill's, measured between them: bench.prefill).
SINGLE_STREAM_REQUESTS = 16


@dataclass(frozen=True)
class BenchOptions:
    concurrency: tuple[int, ...]
    output_tokens: int
    requests_per_level: int | None  # None: one wave of C requests per level (C=1: SINGLE_STREAM_REQUESTS)
    max_seconds_per_level: float
    naive_requests: int
    skip_references: bool
    skip_continuous_batching: bool
    skip_server: bool
    worker_args: tuple[str, ...]
    skip_structured: bool = False

    def first_prompt(self, concurrency: int) -> int:
        """Index of the first prompt of a level: each level takes the next prompts of the list, so no
        served prompt repeats one an earlier level sent (the prefix cache would hold it whole)."""
        before = self.concurrency[: self.concurrency.index(concurrency)]
        return sum(self.requests_at(level) for level in before)

    def requests_at(self, concurrency: int) -> int:
        """How many requests the sweep sends at one concurrency level."""
        if self.requests_per_level:
            return self.requests_per_level
        return SINGLE_STREAM_REQUESTS if concurrency == 1 else concurrency


def _concurrency_list(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--concurrency wants integers like 1,8,32: {error}") from error
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError("--concurrency wants positive integers like 1,8,32")
    return levels


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Concurrency sweep through the real gateway, plus in-process transformers references.",
    )
    add = parser.add_argument
    add("--concurrency", type=_concurrency_list, help="levels of the sweep (default 1,8,32,64)")
    add("--output-tokens", type=_positive_int, help="tokens per request, forced (default 64)")
    add(
        "--requests-per-level",
        type=_positive_int,
        help=f"requests per level (default: C, one wave; C=1 sends {SINGLE_STREAM_REQUESTS} "
        "one after another, so its TTFT p50 is a median)",
    )
    add(
        "--max-seconds-per-level",
        type=float,
        default=DEFAULT_MAX_SECONDS_PER_LEVEL,
        help="stop a level (and a static-batch reference) after this long and report partial numbers",
    )
    add("--naive-requests", type=_positive_int, default=4, help="one-at-a-time reference requests")
    add("--quick", action="store_true", help="smoke run: concurrency 1,8 and 32 tokens")
    add("--skip-references", action="store_true", help="only the HTTP sweep")
    add("--skip-continuous-batching", action="store_true", help="leave out model.generate_batch")
    add("--skip-server", action="store_true", help="only the in-process references")
    add(
        "--skip-structured",
        action="store_true",
        help="leave out the structured-output phase (32 rows, half with a JSON schema; in process, served)",
    )
    add(
        "--worker-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="passed to `tokenferry worker` (repeatable), e.g. --worker-arg=--max-batch-size=64",
    )
    return parser


def parse_options(argv: Sequence[str] | None = None) -> BenchOptions:
    args = _parser().parse_args(argv)
    quick = bool(args.quick)
    return BenchOptions(
        concurrency=args.concurrency or (QUICK_CONCURRENCY if quick else DEFAULT_CONCURRENCY),
        output_tokens=args.output_tokens or (QUICK_OUTPUT_TOKENS if quick else DEFAULT_OUTPUT_TOKENS),
        requests_per_level=args.requests_per_level,
        max_seconds_per_level=args.max_seconds_per_level,
        naive_requests=args.naive_requests,
        skip_references=args.skip_references,
        skip_continuous_batching=args.skip_continuous_batching,
        skip_server=args.skip_server,
        worker_args=tuple(args.worker_arg),
        skip_structured=args.skip_structured,
    )
