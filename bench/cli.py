"""Owns the run order of ``python -m bench``: references first, then the server sweep, then the summary.

The in-process references run before any server process exists, and their
model is released before the servers start, so the two never compete for the
cores. The exception is the prefill reference (``bench.prefill``): it is measured
within the served C=1 level, each of its requests run between two served ones
while the servers are idle, on a model copy loaded just before that level and
released after it. Ctrl-C (or SIGTERM, mapped onto it) unwinds through the
``finally`` of ``bench.servers.running_servers``, which stops every process it
started; what was measured before the interruption is still summarized, and the
exit code is 130.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import load, prefill, references, structured
from bench.options import BenchOptions, parse_options
from bench.prompts import render_prompt_ids, user_prompts
from bench.report import Results, emit, note, ratios, table
from bench.servers import RunningServers, running_servers
from bench.stats import summarize_level

if TYPE_CHECKING:
    from worker.model.loading import LoadedModel

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


def _prompt_count(options: BenchOptions) -> int:
    """Prompts the references need: every level's first C (``first_prompt`` on) and the naive requests'."""
    ends = [options.first_prompt(c) + c for c in options.concurrency]
    return max(*ends, options.naive_requests, structured.ROWS)


def _level_prompts(options: BenchOptions, prompts: list[list[int]], concurrency: int) -> list[list[int]]:
    """The first C prompts the served level C sends: the references at C run the same ones."""
    first = options.first_prompt(concurrency)
    return prompts[first : first + concurrency]


def run_references(options: BenchOptions, results: Results) -> None:
    """Naive, static-batch and engine, then generate_batch, in this process (prefill: ``--skip-server`` only).

    Both models are locals, so they are freed when this returns, before any server starts.
    """
    note("loading the model twice for the in-process references: plain, and as the worker sets it up")
    loaded = references.load_reference_model()
    served = references.load_engine_model()
    prompts = [render_prompt_ids(loaded.tokenizer, prompt) for prompt in user_prompts(_prompt_count(options))]
    tokens, cap = options.output_tokens, options.max_seconds_per_level
    references.warm_up(loaded, prompts[0])
    note(f"naive: {options.naive_requests} requests one at a time")
    naive = references.naive(loaded, prompts[: options.naive_requests], tokens, cap)
    results.naive = emit("reference_naive", naive)
    references.warm_up(served, prompts[0])  # the engine reference's first steps would pay for it
    if options.skip_server and 1 in options.concurrency:
        _run_prefill_alone(options, served, results)
    for concurrency in options.concurrency:
        note(f"static batch of {concurrency}")
        measured = references.static_batch(loaded, _level_prompts(options, prompts, concurrency), tokens, cap)
        results.static[concurrency] = emit("reference_static_batch", {"concurrency": concurrency, **measured})
        note(f"tokenferry engine in-process, {concurrency} requests")
        measured = references.engine(served, _level_prompts(options, prompts, concurrency), tokens)
        results.engine[concurrency] = emit("reference_engine", {"concurrency": concurrency, **measured})
    if not options.skip_structured:
        note(f"structured outputs in-process: {structured.ROWS} rows free, then half with a JSON schema")
        level = prompts[-structured.ROWS :]
        results.structured_engine = emit("reference_structured", structured.in_process(served, level, tokens))
    if not options.skip_continuous_batching:
        _run_continuous_batching(options, loaded, prompts, results)


def _run_prefill_alone(options: BenchOptions, served: LoadedModel, results: Results) -> None:
    """With ``--skip-server`` there is no served C=1 level to interleave with: the prefill runs alone."""
    requests = options.requests_at(1)
    note(f"in-process prefill: {requests} requests one at a time, not paired (--skip-server)")
    cap = options.max_seconds_per_level
    measured = prefill.measure_alone(served, options.first_prompt(1), requests, options.output_tokens, cap)
    results.prefill = emit("reference_prefill", measured)


def _run_continuous_batching(
    options: BenchOptions, loaded: LoadedModel, prompts: list[list[int]], results: Results
) -> None:
    for concurrency in options.concurrency:
        note(f"generate_batch of {concurrency}")
        if results.static[concurrency]["partial"]:
            measured = {"batch_size": concurrency, "skipped": "static batch hit --max-seconds-per-level"}
        else:
            level = _level_prompts(options, prompts, concurrency)
            measured = references.continuous_batching(loaded, level, options.output_tokens)
        line = emit("reference_continuous_batching", {"concurrency": concurrency, **measured})
        results.continuous[concurrency] = line


async def _run_level(
    servers: RunningServers,
    options: BenchOptions,
    concurrency: int,
    after_request: Callable[[int], None] | None = None,
) -> load.LevelRun:
    requests = options.requests_at(concurrency)
    note(f"gateway: {requests} requests at concurrency {concurrency}")
    return await load.run_level(
        servers.base_url,
        servers.model,
        concurrency=concurrency,
        requests=requests,
        max_tokens=options.output_tokens,
        max_seconds=options.max_seconds_per_level,
        first_prompt=options.first_prompt(concurrency),
        after_request=after_request,
    )


def _gateway_fields(
    servers: RunningServers, options: BenchOptions, concurrency: int, run: load.LevelRun
) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "output_tokens_per_request": options.output_tokens,
        "partial": run.deadline_hit,
        "max_seconds_per_level": options.max_seconds_per_level,
        **summarize_level(run.records, run.wall_s, options.output_tokens),
        "model": servers.model,
        "worker_args": list(servers.worker_argv),
    }


async def _run_single_stream_paired(servers: RunningServers, options: BenchOptions, results: Results) -> None:
    """The C=1 level with the in-process prefill of each prompt run right after its served request.

    The model copy is loaded here, while no request is in flight, and freed when this returns.
    Loading blocks the event loop, which has nothing else to run between two levels.
    """
    note("loading the model as the worker sets it up, for the prefill reference interleaved with C=1")
    served = references.load_engine_model()
    cap = options.max_seconds_per_level
    requests, first = options.requests_at(1), options.first_prompt(1)
    reference = prefill.PrefillReference(served, first, requests, options.output_tokens, cap)
    note("in-process prefill of each C=1 prompt, run after its served request has ended")
    run = await _run_level(servers, options, 1, after_request=reference.measure)
    results.gateway[1] = emit("gateway", _gateway_fields(servers, options, 1, run))
    results.prefill = emit("reference_prefill", prefill.paired_fields(reference, run.records))


async def _sweep(servers: RunningServers, options: BenchOptions, results: Results) -> None:
    warm = await load.warm_up(servers.base_url, servers.model, _WARM_UP_TIMEOUT_S)
    if warm.error:
        note(f"warm-up request failed: {warm.error}")
    for concurrency in options.concurrency:
        if concurrency == 1 and not options.skip_references:
            await _run_single_stream_paired(servers, options, results)
            continue
        run = await _run_level(servers, options, concurrency)
        results.gateway[concurrency] = emit("gateway", _gateway_fields(servers, options, concurrency, run))
    if not options.skip_structured:
        note(
            f"gateway: {structured.ROWS} free requests, then {structured.ROWS} with half of them constrained"
        )
        # After every level's prompts: none is in the worker's prefix cache whole.
        first = sum(options.requests_at(level) for level in options.concurrency)
        measured = await structured.served(
            servers.base_url, servers.model, options.output_tokens, first, options.max_seconds_per_level
        )
        results.structured_gateway = emit("gateway_structured", measured)


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
