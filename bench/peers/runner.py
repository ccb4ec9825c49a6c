"""Owns the run order of ``python -m bench.peers``: machine limits, then each dtype's systems in turn.

Per dtype, vLLM's own server runs first (the others' ratios need it), then tokenferry's
native engine (and ``native-compiled``, ``--compile``, when asked), then tokenferry with
``--engine vllm``; each system is stopped before the next starts, so each has both cores.
Per system: one unmeasured warm-up request, the chat levels in increasing concurrency,
then the long-prompt workload. A system that does not start becomes a ``peers_error``
line with its log's tail, and the run goes on. Ctrl-C (or SIGTERM) stops the running
system and summarizes what was measured (exit code 130).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import platform
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import load
from bench.peers import loop_time, report, workloads
from bench.peers.machine import MachineLimits, measure_limits
from bench.peers.memory import Sampler, peak_mb
from bench.peers.options import OUTPUT_TOKENS, PeersOptions, estimate_s, parse_options, requests_at
from bench.peers.shares import machine_shares, parameter_count
from bench.peers.systems import REPOSITORY, Endpoint, SystemSetup, SystemStartError, running_system
from bench.stats import summarize_level

WARM_UP_TIMEOUT_S = 300.0
MEMORY_INTERVAL_S = 0.1
LOG_TAIL_CHARS = 4000


@dataclasses.dataclass
class Run:
    """What the run has measured so far, and what every level needs to be put in context."""

    options: PeersOptions
    setup: SystemSetup
    parameters: int
    limits: MachineLimits | None = None
    long: list[workloads.LongRequest] = dataclasses.field(default_factory=list)
    lines: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    baselines: dict[tuple[str, str, int], dict[str, Any]] = dataclasses.field(default_factory=dict)

    def record(self, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        line = report.emit(kind, fields)
        self.lines.append(line)
        return line


def bundled_model_dir() -> Path:
    """The bundled GGUF's converted safetensors directory, converting it first if needed (~35 s)."""
    from shared.settings import WorkerSettings
    from worker.model.loading import converted_gguf_dir
    from worker.model.sources import resolve_source

    settings = WorkerSettings()
    return converted_gguf_dir(resolve_source(settings.model), settings.cache_dir)


def _level_fields(endpoint: Endpoint, workload: str, concurrency: int) -> dict[str, Any]:
    return {
        "system": endpoint.system,
        "dtype": endpoint.dtype,
        "workload": workload,
        "concurrency": concurrency,
        "model": endpoint.model,
    }


def _record_level(
    run: Run,
    fields: dict[str, Any],
    level: load.LevelRun,
    expected: int,
    *,
    processed_tokens: int = 0,
    corrections: dict[str, Any] | None = None,
) -> None:
    """Summarize a level, compare it with vLLM's and the machine's limits, and emit it.

    ``processed_tokens``: prompt tokens the level also computed (the long workload), counted
    with its output tokens in its model GFLOP/s. ``corrections`` replace summary fields.
    """
    summary = summarize_level(level.records, level.wall_s, expected)
    line = {**fields, "partial": level.deadline_hit, **summary, **(corrections or {})}
    key = report.level_key(line)
    line |= report.vs_baseline(line, run.baselines.get(key))
    if run.limits is not None:
        computed = line["output_tokens"] + (processed_tokens if not level.deadline_hit else 0)
        line |= machine_shares(
            line["output_tokens_per_s"],
            computed_tokens_per_s=computed / level.wall_s if level.wall_s > 0 else None,
            concurrency=line["concurrency"],
            dtype=line["dtype"],
            parameters=run.parameters,
            limits=run.limits,
            prefill_bound=line["workload"] == "long",
        )
    if line["system"] == report.BASELINE:
        run.baselines[key] = line
    run.record("peers_level", line)


async def _chat_levels(run: Run, endpoint: Endpoint) -> None:
    for concurrency in run.options.levels:
        requests = requests_at(concurrency)
        report.note(f"{endpoint.system} {endpoint.dtype}: {requests} chat requests at c={concurrency}")
        level, worker_fields = await _run_observed(
            endpoint,
            concurrency=concurrency,
            requests=requests,
            max_tokens=OUTPUT_TOKENS,
            max_seconds=run.options.max_seconds_per_level,
            first_prompt=run.options.first_prompt(concurrency),
        )
        fields = _level_fields(endpoint, "chat", concurrency) | {"output_tokens_per_request": OUTPUT_TOKENS}
        fields |= worker_fields
        _record_level(run, fields, level, OUTPUT_TOKENS)


async def _long_level(run: Run, endpoint: Endpoint) -> None:
    concurrency, requests = run.options.long_concurrency, len(run.long)
    report.note(f"{endpoint.system} {endpoint.dtype}: {requests} long-prompt requests at c={concurrency}")
    level, worker_fields = await _run_observed(
        endpoint,
        concurrency=concurrency,
        requests=requests,
        max_tokens=max(request.max_tokens for request in run.long),
        max_seconds=run.options.max_seconds_per_level,
        extra_body=workloads.long_body(run.long),
    )
    short = sum(
        record.error is None and not record.truncated and record.tokens < run.long[record.index].max_tokens
        for record in level.records
    )
    fields = _level_fields(endpoint, "long", concurrency) | {
        "prompt_tokens": sum(request.prompt_tokens for request in run.long),
        "forced_output_tokens": sum(request.max_tokens for request in run.long),
    }
    fields |= worker_fields
    # Short against each request's own length, not one length for all.
    corrections = {"short_requests": short}
    _record_level(run, fields, level, 0, processed_tokens=fields["prompt_tokens"], corrections=corrections)


async def _run_observed(endpoint: Endpoint, **level: Any) -> tuple[load.LevelRun, dict[str, Any]]:
    """One level (``load.run_level``'s arguments), and what the engine's side showed meanwhile: the
    worker loop's share (``loop_time``) and the engine process's peak resident memory, sampled
    every ``MEMORY_INTERVAL_S`` (no gauges: a scrape costs the worker's loop)."""
    before = await loop_time.read(endpoint.worker_metrics_url)
    pid = endpoint.engine_pid
    with Sampler(pid or 0, None, MEMORY_INTERVAL_S, enabled=pid is not None) as memory:
        observed = await load.run_level(endpoint.base_url, endpoint.model, **level)
    fields = loop_time.share(before, await loop_time.read(endpoint.worker_metrics_url))
    return observed, fields | {"engine_rss_peak_mb": peak_mb(memory.samples)}


async def _measure(run: Run, endpoint: Endpoint) -> None:
    warm = await load.warm_up(endpoint.base_url, endpoint.model, WARM_UP_TIMEOUT_S)
    if warm.error:
        report.note(f"{endpoint.system}: warm-up request failed: {warm.error}")
    await _chat_levels(run, endpoint)
    if run.long:
        await _long_level(run, endpoint)


def run_system(run: Run, system: str, dtype: str) -> None:
    """Start one system, measure it, stop it; a start failure becomes a ``peers_error`` line."""
    report.note(f"starting {system} at {dtype}")
    started = time.perf_counter()
    try:
        with running_system(system, dtype, run.setup) as endpoint:
            report.note(
                f"{system} ready in {time.perf_counter() - started:.0f} s (logs in {endpoint.logs_dir})"
            )
            asyncio.run(_measure(run, endpoint))
    except SystemStartError as error:
        message = str(error)
        report.note(f"{system} at {dtype} did not start:\n{message[-LOG_TAIL_CHARS:]}")
        first, _, tail = message.partition("\n")
        last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
        run.record(
            "peers_error",
            {
                "system": system,
                "dtype": dtype,
                "error": f"{first}: {last.strip()}",
                "log_tail": tail[-LOG_TAIL_CHARS:],
            },
        )


def _run_fields(options: PeersOptions, model_dir: Path, parameters: int) -> dict[str, Any]:
    return {
        "options": dataclasses.asdict(options),
        "model_dir": str(model_dir),
        "parameters": parameters,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "estimated_s": round(estimate_s(options)),
    }


def _prepare(run: Run) -> None:
    """The machine's limits and the long workload's prompts, before any system starts."""
    report.note("measuring the machine's limits (linear layers, memory copy)")
    run.limits = measure_limits(run.options.dtypes)
    run.record("peers_machine", dataclasses.asdict(run.limits))
    if not run.options.skip_long:
        count_tokens, overhead = workloads.tokenizer_counters(str(run.setup.model_dir))
        run.long = workloads.long_requests(
            count_tokens, overhead, run.options.long_requests, run.options.seed
        )


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_options(argv)
    os.chdir(REPOSITORY)  # children run `python -m cli` from here: this checkout's code, whatever the venv
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM unwinds like Ctrl-C
    report.note(f"estimated duration: about {estimate_s(options) / 60:.0f} min on an idle 2-core machine")
    if (load_before := os.getloadavg()[0]) > 0.5:
        report.note(
            f"load average is {load_before:.2f} before starting: other processes will slow the numbers"
        )
    model_dir = bundled_model_dir()
    parameters = parameter_count(model_dir)
    setup = SystemSetup(model_dir, options.vllm_python, options.worker_args)
    run = Run(options, setup, parameters)
    run.record("peers_run", _run_fields(options, model_dir, parameters))
    started, exit_code = time.perf_counter(), 0
    try:
        _prepare(run)
        for dtype in options.dtypes:
            for system in options.systems:
                run_system(run, system, dtype)
    except KeyboardInterrupt:
        report.note("interrupted: summarizing what was measured")
        exit_code = 130
    print(report.summary(run.lines, run.limits, parameters), flush=True)
    if options.json_out:
        report.write_document(Path(options.json_out), run.lines)
    report.note(f"done in {time.perf_counter() - started:.0f} s")
    sys.exit(exit_code)
