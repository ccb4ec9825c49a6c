"""Batch bench (``make bench-batch``): a 1,000-line batch beside interactive traffic, with faults.

Real processes on loopback: a private Redis with its append-only file on, one
``tokenferry gateway`` and two ``tokenferry worker`` processes (``--workers``), with
the fake engine by default, ``--real`` for the bundled model. It measures:

1. interactive time to first token with the cluster idle (streamed chat requests
   one after another);
2. the same while a batch runs undisturbed: what a batch costs interactive
   traffic (the issue's bound is 1.5x the idle p50);
3. a second batch during which one worker is SIGKILLed (a new one replaces it) at
   25% of the lines and Redis is restarted at 50%, probed the same way: TTFT then
   mixes in the recovery, so it is reported apart rather than blamed on the batch;
4. each batch's lines per second, and lines lost or duplicated: every
   ``custom_id`` of the input must be in the output exactly once.

Prints one JSON line per phase, then a summary.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.stats import percentile
from shared.redis_server import EmbeddedRedis, free_port
from shared.supervisor import Child, NotReady, served_models, wait_until
from tests.processes import spawn_cli, stop_all, wait_for_model

MODEL = "bench-batch-model"


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per batch line")
    parser.add_argument("--probes", type=int, default=30, help="interactive requests per TTFT phase")
    parser.add_argument("--step-delay", type=float, default=0.01, help="fake engine seconds per decode step")
    parser.add_argument("--real", action="store_true", help="the bundled model instead of the fake engine")
    parser.add_argument(
        "--workers", type=int, default=2, help="worker processes (one is SIGKILLed mid-batch)"
    )
    parser.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="passed to each `tokenferry worker` (repeatable), e.g. --worker-arg=--batch-share=0.25",
    )
    return parser.parse_args()


class Cluster:
    def __init__(self, redis: EmbeddedRedis, options: argparse.Namespace) -> None:
        self.redis = redis
        self.options = options
        self.port = free_port()
        self.gateway = spawn_cli(
            "gateway", "--redis-url", redis.url, "--port", str(self.port), "--log-level", "WARNING"
        )
        self.workers = [self.add_worker() for _ in range(options.workers)]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_worker(self) -> Child:
        engine = [] if self.options.real else ["--engine", "fake", "--model", MODEL]
        env = {"TOKENFERRY_FAKE_STEP_DELAY_S": str(self.options.step_delay)}
        return spawn_cli(
            "worker",
            "--redis-url",
            self.redis.url,
            *engine,
            *self.options.worker_arg,
            "--log-level",
            "WARNING",
            env=env,
        )

    def model(self) -> str:
        if self.options.real:
            return _first_model(self.url)
        wait_for_model(self.url, [self.gateway, *self.workers], MODEL, 300)
        return MODEL

    def stop(self) -> None:
        stop_all([self.gateway, *self.workers], timeout_s=10)


def _first_model(url: str) -> str:
    try:
        return wait_until(lambda: served_models(url, timeout_s=5), (), timeout_s=300, what="a model")[0]
    except NotReady:
        raise RuntimeError("no model was served within 300 s") from None


def ttft_s(http: httpx.Client, model: str) -> float | None:
    """Seconds to the first content chunk of one streamed chat request (None: it failed).

    ``http`` is one client kept for every probe, as an application keeps its SDK client:
    a new client per request would add its own set-up (~45 ms here, mostly the TLS
    context httpx builds even for plain HTTP) to both phases and hide the server's ratio.
    """
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    started = time.perf_counter()
    try:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data:") and '"content":"' in line and '"content":""' not in line:
                    return time.perf_counter() - started
    except httpx.HTTPError:
        return None
    return None


def _summary(samples: list[float]) -> dict[str, float]:
    p50, p99 = percentile(samples, 50), percentile(samples, 99)
    if p50 is None or p99 is None:
        raise ValueError("no TTFT probe of the phase succeeded")
    return {"p50_ms": 1000 * p50, "p99_ms": 1000 * p99, "n": len(samples)}


def _input_file(directory: Path, model: str, lines: int, max_tokens: int) -> Path:
    path = directory / "batch.jsonl"
    with path.open("w") as handle:
        for index in range(lines):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"Line {index}"}],
                "max_tokens": max_tokens,
            }
            handle.write(
                json.dumps(
                    {"custom_id": f"l{index}", "method": "POST", "url": "/v1/chat/completions", "body": body}
                )
                + "\n"
            )
    return path


def _retrieve(client: openai.OpenAI, batch_id: str) -> Any:
    """The batch, retrying through the Redis restart (the gateway answers 503 meanwhile)."""
    for _ in range(100):
        try:
            return client.batches.retrieve(batch_id)
        except (openai.APIStatusError, openai.APIConnectionError):
            time.sleep(0.2)
    raise RuntimeError("the gateway did not answer for 20 s")


def run_batch_phase(
    cluster: Cluster, client: openai.OpenAI, http: httpx.Client, model: str, path: Path, *, faults_on: bool
) -> dict[str, Any]:
    """Submit the batch, probe TTFT while it runs, inject the faults if asked; the phase's numbers."""
    with path.open("rb") as handle:
        file_id = client.files.create(file=handle, purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    started = time.monotonic()
    probes: list[float | None] = []
    faults: list[str] = []
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        counts = batch.request_counts
        done = (counts.completed + counts.failed) if counts and counts.total else 0
        total = counts.total if counts and counts.total else cluster.options.lines
        if faults_on:
            faults += _inject(cluster, done / total, faults)
        if batch.status == "in_progress" and 0 < done < total * 0.9 and len(probes) < cluster.options.probes:
            probes.append(ttft_s(http, model))
        time.sleep(0.1)
        batch = _retrieve(client, batch.id)
    elapsed = time.monotonic() - started
    return {"batch": batch, "elapsed_s": elapsed, "probes": probes, "faults": faults}


def _inject(cluster: Cluster, progress: float, done: list[str]) -> list[str]:
    if progress >= 0.25 and "worker_kill" not in done:
        cluster.workers[0].send_signal(signal.SIGKILL)
        cluster.workers[0] = cluster.add_worker()
        return ["worker_kill"]
    if progress >= 0.5 and "redis_restart" not in done:
        cluster.redis.restart()
        return ["redis_restart"]
    return []


def lost_and_duplicated(client: openai.OpenAI, batch: Any, lines: int) -> tuple[int, int]:
    ids: list[str] = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            ids += [json.loads(line)["custom_id"] for line in client.files.content(file_id).text.splitlines()]
    expected = {f"l{index}" for index in range(lines)}
    return len(expected - set(ids)), len(ids) - len(set(ids))


def main() -> None:
    options = _options()
    with EmbeddedRedis(append_only=True) as redis, tempfile.TemporaryDirectory() as directory:
        cluster = Cluster(redis, options)
        try:
            model = cluster.model()
            client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0)
            http = httpx.Client(base_url=cluster.url, timeout=60)
            ttft_s(http, model)  # warm-up
            idle = [ttft_s(http, model) for _ in range(options.probes)]
            calm = _summary([s for s in idle if s is not None])
            print(json.dumps({"phase": "idle", "ttft": calm}), flush=True)
            path = _input_file(Path(directory), model, options.lines, options.max_tokens)
            results = []
            for phase, faults_on in (("batch", False), ("batch_with_faults", True)):
                result = run_batch_phase(cluster, client, http, model, path, faults_on=faults_on)
                results.append(phase_numbers(client, phase, result, calm, options))
                print(json.dumps(results[-1]), flush=True)
            print(summary_line(calm, *results))
            ok = all(
                r["status"] == "completed" and r["lines_lost"] == r["lines_duplicated"] == 0 for r in results
            )
            sys.exit(0 if ok else 1)
        finally:
            cluster.stop()


def phase_numbers(
    client: openai.OpenAI,
    phase: str,
    result: dict[str, Any],
    calm: dict[str, float],
    options: argparse.Namespace,
) -> dict[str, Any]:
    batch = result["batch"]
    lost, duplicated = lost_and_duplicated(client, batch, options.lines)
    busy = _summary([s for s in result["probes"] if s is not None])
    # The bench's own clock, from creating the batch to seeing it completed: OpenAI's
    # timestamps are whole seconds, too coarse for a batch of a few seconds.
    run_s = result["elapsed_s"]
    return {
        "phase": phase,
        "status": batch.status,
        "lines": options.lines,
        "lines_per_s": round(options.lines / max(run_s, 1e-9), 1),
        "wall_s": round(result["elapsed_s"], 1),
        "ttft_during_batch": busy,
        "ttft_ratio_p50": round(busy["p50_ms"] / calm["p50_ms"], 2) if calm["p50_ms"] else None,
        "ttft_ratio_p99": round(busy["p99_ms"] / calm["p99_ms"], 2) if calm["p99_ms"] else None,
        "failed_probes": sum(1 for s in result["probes"] if s is None),
        "faults": result["faults"],
        "lines_lost": lost,
        "lines_duplicated": duplicated,
        "request_counts": batch.request_counts.model_dump() if batch.request_counts else None,
    }


def summary_line(calm: dict[str, float], clean: dict[str, Any], faulted: dict[str, Any]) -> str:
    def ttft(numbers: dict[str, Any]) -> str:
        busy = numbers["ttft_during_batch"]
        return (
            f"p50 {busy['p50_ms']:.0f} ms p99 {busy['p99_ms']:.0f} ms "
            f"(x{numbers['ttft_ratio_p50']} / x{numbers['ttft_ratio_p99']})"
        )

    return (
        f"\nTTFT idle p50 {calm['p50_ms']:.0f} ms p99 {calm['p99_ms']:.0f} ms\n"
        f"batch: {clean['lines']} lines at {clean['lines_per_s']} lines/s; TTFT during it {ttft(clean)}; "
        f"lines lost {clean['lines_lost']}, duplicated {clean['lines_duplicated']}\n"
        f"batch with faults ({', '.join(faulted['faults']) or 'none'}): {faulted['lines_per_s']} lines/s; "
        f"TTFT during it {ttft(faulted)}; "
        f"lines lost {faulted['lines_lost']}, duplicated {faulted['lines_duplicated']}"
    )


if __name__ == "__main__":
    main()
