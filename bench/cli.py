"""Owns the run order of ``python -m bench``: references first, then the server sweep, then the summary.

The in-process references run before any server process exists, and their
model is released before the servers start, so the two never compete for the
cores. Ctrl-C (or SIGTERM, mapped onto it) unwinds through the ``finally`` of
``bench.servers.running_servers``, which stops every process it started; what
was measured before the interruption is still summarized, and the exit code is 130.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import load, references
from bench.options import BenchOptions, parse_options
from bench.prompts import render_prompt_ids, user_prompts
from bench.report import Results, emit, note, ratios, table
from bench.servers import RunningServers, running_servers
from bench.stats import summarize_level

_WARM_UP_TIMEOUT_S = 300.0
_CAPTURE: dict[str, Any] = {
    "capture_output": True, "text": True, "timeout": 5, "cwd": Path(__file__).resolve().parent.parent
}  # fmt: skip


def _git_revision() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], **_CAPTURE)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], **_CAPTURE)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return str(head.stdout).strip() + ("-dirty" if str(dirty.stdout).strip() else "")


def _run_fields(options: BenchOptions) -> dict[str, Any]:
    return {
        "options": dataclasses.asdict(options),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "git": _git_revision(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def worker_argv(options: BenchOptions) -> list[str]:
    """The worker's flags: the user's, plus a batch size that admits the largest C unless they chose one."""
    argv = list(options.worker_args)
    if not any(arg.startswith("--max-batch-size") for arg in argv):
        argv.append(f"--max-batch-size={max(options.concurrency)}")
    return argv


def run_references(options: BenchOptions, results: Results) -> None:
    """Naive, static-batch and generate_batch references, in that order, in this process."""
    note("loading the model for the in-process references")
    loaded = references.load_reference_model()
    count = max(max(options.concurrency), options.naive_requests)
    prompts = [render_prompt_ids(loaded.tokenizer, prompt) for prompt in user_prompts(count)]
    tokens, cap = options.output_tokens, options.max_seconds_per_level
    references.warm_up(loaded, prompts[0])
    note(f"naive: {options.naive_requests} requests one at a time")
    naive = references.naive(loaded, prompts[: options.naive_requests], tokens, cap)
    results.naive = emit("reference_naive", naive)
    for concurrency in options.concurrency:
        note(f"static batch of {concurrency}")
        measured = references.static_batch(loaded, prompts[:concurrency], tokens, cap)
        results.static[concurrency] = emit("reference_static_batch", {"concurrency": concurrency, **measured})
        note(f"tokenferry engine in-process, {concurrency} requests")
        measured = references.engine(loaded, prompts[:concurrency], tokens)
        results.engine[concurrency] = emit("reference_engine", {"concurrency": concurrency, **measured})
    if options.skip_continuous_batching:
        return
    for concurrency in options.concurrency:
        note(f"generate_batch of {concurrency}")
        if results.static[concurrency]["partial"]:
            measured = {"batch_size": concurrency, "skipped": "static batch hit --max-seconds-per-level"}
        else:
            measured = references.continuous_batching(loaded, prompts[:concurrency], tokens)
        line = emit("reference_continuous_batching", {"concurrency": concurrency, **measured})
        results.continuous[concurrency] = line


async def _sweep(servers: RunningServers, options: BenchOptions, results: Results) -> None:
    warm = await load.warm_up(servers.base_url, servers.model, _WARM_UP_TIMEOUT_S)
    if warm.error:
        note(f"warm-up request failed: {warm.error}")
    for concurrency in options.concurrency:
        requests = options.requests_at(concurrency)
        note(f"gateway: {requests} requests at concurrency {concurrency}")
        run = await load.run_level(
            servers.base_url,
            servers.model,
            concurrency=concurrency,
            requests=requests,
            max_tokens=options.output_tokens,
            max_seconds=options.max_seconds_per_level,
        )
        fields = {
            "concurrency": concurrency,
            "output_tokens_per_request": options.output_tokens,
            "partial": run.deadline_hit,
            "max_seconds_per_level": options.max_seconds_per_level,
            **summarize_level(run.records, run.wall_s, options.output_tokens),
            "model": servers.model,
            "worker_args": list(servers.worker_argv),
        }
        results.gateway[concurrency] = emit("gateway", fields)


def run_sweep(options: BenchOptions, results: Results) -> None:
    note("starting redis, worker and gateway")
    with running_servers(worker_argv(options)) as servers:
        note(f"servers ready at {servers.base_url} (logs in {servers.logs_dir})")
        asyncio.run(_sweep(servers, options, results))


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM unwinds like Ctrl-C
    results = Results()
    started = time.perf_counter()
    exit_code = 0
    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        note(f"load average is {load_before:.2f} before starting: other processes will slow the numbers")
    emit("run", _run_fields(options))
    try:
        if not options.skip_references:
            run_references(options, results)
        if not options.skip_server:
            run_sweep(options, results)
    except KeyboardInterrupt:
        note("interrupted: summarizing what was measured")
        exit_code = 130
    for line in ratios(results):
        emit("ratio", line)
    print(table(results, options.output_tokens), flush=True)
    note(f"done in {time.perf_counter() - started:.0f} s")
    sys.exit(exit_code)
