"""Owns the worker's Prometheus metrics and its load summary for the heartbeat.

The driver feeds it between engine steps (``observe_engine``, ``observe_step``,
``observe_acceptance``, ``observe_outcomes``); nothing here runs inside the engine step itself, so the
compute thread never touches prometheus_client. Each worker builds its own
``CollectorRegistry`` (several in-process workers in tests never collide), and
serves it on ``--metrics-port`` with prometheus_client's WSGI app, the worker's
/health and /ready probes beside it (``worker/probes.py``).

Intentional divergence: the metrics port is off by default. A host often runs
several workers (one per GPU, or the all-in-one ``serve`` beside tests), and a
fixed default port would make the second one fail to start; operators name the
port in their manifests (9100 in deploy/) and scrape it.

Every metric carries the served model as ``model_name``, as vLLM's do, so one
dashboard reads both and several models' workers sum by model. A request that
ends here is counted once in ``request_success_total{finished_reason}`` (vLLM's
name; it counts every reason, not only successes): stop and length from its
``Finished`` event, error from a ``Failed`` one the step loop publishes, abort
and worker bugs from the job handler. Requests refused before they started
(invalid parameters, a prompt too long) are not: their client got a 4xx, as
vLLM's front end refuses them before its engine sees them. A request taken over
after its worker died is counted by the worker that ends it. The prompt and
generation length histograms observe completed requests (stop or length) only.

Tokens per second is not a metric: Prometheus derives it from the token
counters with ``rate()``. The heartbeat's ``generation_tokens_per_s`` is the same
rate over the last heartbeat interval, for ``tokenferry status``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from enum import StrEnum
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from shared.protocol import Failed, Finished, FinishReason, GenerationJob, TokenEvent
from shared.registry import WorkerLoad
from worker.engine import EngineStats, SequenceUpdate
from worker.probes import Probes, serve_wsgi

logger = logging.getLogger(__name__)

NAMESPACE = "tokenferry_worker"
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# From a fast decode step on a GPU (a few ms) to a long CPU prefill chunk.
STEP_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
STEP_GAP_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
QUEUE_WAIT_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# vLLM's 1-2-5 series for request lengths; it stops at max_model_len, which is not known before the
# model loads (the port is bound first), so ours runs to a million tokens.
REQUEST_TOKENS_BUCKETS = (*(mantissa * 10**power for power in range(6) for mantissa in (1, 2, 5)), 1_000_000)
# A cached grammar costs nothing; a fresh JSON schema ~1 ms on a CPU; a large tool list or grammar far more.
GRAMMAR_COMPILE_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MODEL_LABEL = "model_name"


class FinishedReason(StrEnum):
    """Why a request ended here: the ``finished_reason`` label (vLLM's values, less "repetition")."""

    STOP = "stop"  # an EOS token or a stop sequence (a tool call's end too, as vLLM counts it)
    LENGTH = "length"  # max_tokens, or the model's context
    ABORT = "abort"  # the client cancelled it (a disconnect, a deadline)
    ERROR = "error"  # the model or the worker failed it


def finished_reason(reason: FinishReason) -> FinishedReason:
    """The label of a request that finished: vLLM's engine stops at a tool call's end, so it is ``stop``."""
    return FinishedReason.LENGTH if reason is FinishReason.LENGTH else FinishedReason.STOP


class MetricsServer:
    """prometheus_client's HTTP server in its daemon thread; ``close`` stops it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class WorkerMetrics:
    """One worker's metrics; all ``observe_*`` calls come from the event loop's thread.

    Every metric carries ``model_name`` (the served model, as vLLM labels its own), set
    once here: a worker serves one model for its whole life.
    """

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self._define_gauges()
        self._define_flows()
        self._define_requests()
        # Plain copies for the heartbeat: prometheus_client has no public read of a value.
        self._engine_stats = EngineStats(running=0, waiting=0)
        self._generated = 0
        self._load_window = (time.monotonic(), 0)

    def _gauge(self, name: str, documentation: str) -> Gauge:
        metric = Gauge(name, documentation, [MODEL_LABEL], namespace=NAMESPACE, registry=self.registry)
        return metric.labels(self.model_name)

    def _counter(self, name: str, documentation: str) -> Counter:
        metric = Counter(name, documentation, [MODEL_LABEL], namespace=NAMESPACE, registry=self.registry)
        return metric.labels(self.model_name)

    def _histogram(self, name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
        metric = Histogram(
            name, documentation, [MODEL_LABEL], namespace=NAMESPACE, registry=self.registry, buckets=buckets
        )
        return metric.labels(self.model_name)

    def _define_gauges(self) -> None:
        self.running = self._gauge("running_sequences", "Sequences in the running batch.")
        self.waiting = self._gauge(
            "waiting_sequences", "Sequences added to the engine, waiting to join the batch."
        )
        self.kv_reserved = self._gauge(
            "kv_cache_reserved_tokens",
            "KV-cache positions the running sequences may grow to (prompt + max new tokens, padded).",
        )
        self.kv_usage = self._gauge(
            "kv_cache_usage_ratio",
            "Reserved KV-cache positions over the KV-cache token budget (0 without a shared cache).",
        )
        self.kv_held = self._gauge(
            "kv_cache_held_tokens",
            "Tokens whose KV the running sequences hold (prompts being prefilled too).",
        )
        self.prefix_cache_held = self._gauge(
            "prefix_cache_held_tokens", "Prompt tokens whose KV the prefix cache holds for reuse."
        )

    def _define_flows(self) -> None:
        self.batch_size = self._histogram(
            "batch_size", "Sequences that produced a token in one engine step.", BATCH_SIZE_BUCKETS
        )
        self.step_seconds = self._histogram(
            "step_duration_seconds", "Wall time of one engine step (one forward pass).", STEP_SECONDS_BUCKETS
        )
        self.step_gap_seconds = self._histogram(
            "step_gap_seconds",
            "From the end of one engine step to the start of the next while sequences run: routing, "
            "publishing and admission, which the engine waits for.",
            STEP_GAP_SECONDS_BUCKETS,
        )
        # The gap's two known parts, so a slow loop says which of them grew.
        self.route_seconds = self._histogram(
            "route_duration_seconds",
            "Turning one step's updates into events (text, stop strings, logprobs) on the worker's loop.",
            STEP_GAP_SECONDS_BUCKETS,
        )
        self.publish_seconds = self._histogram(
            "publish_duration_seconds",
            "Storing one step's events in Redis, retries through an outage included.",
            STEP_GAP_SECONDS_BUCKETS,
        )
        self.queue_wait = self._histogram(
            "queue_wait_seconds",
            "From the job's creation at the gateway to its start on this worker.",
            QUEUE_WAIT_SECONDS_BUCKETS,
        )
        self.prompt_tokens = self._counter("prompt_tokens", "Prompt tokens of accepted requests.")
        self.generation_tokens = self._counter("generation_tokens", "Tokens generated.")
        self.prefix_cache_hits = self._counter(
            "prefix_cache_hit_tokens",
            "Prompt tokens whose KV was reused from the prefix cache instead of prefilled.",
        )
        # Observed from the preparation threads that compile (prometheus_client is thread-safe).
        self.grammar_compile_seconds = self._histogram(
            "grammar_compile_seconds",
            "Compiling one structured-output grammar for the model's vocabulary (cache misses only).",
            GRAMMAR_COMPILE_SECONDS_BUCKETS,
        )
        self.grammar_mask_seconds = self._counter(
            "grammar_mask_seconds",
            "Engine time spent filling and applying structured-output token masks (a share of step time).",
        )
        self.failovers = self._counter(
            "failovers", "Jobs of dead workers this worker's reaper put back in the queue to be resumed."
        )

    def _define_requests(self) -> None:
        finished = Counter(
            "request_success",
            "Requests that ended on this worker, by why they ended (vLLM's name, all four reasons).",
            [MODEL_LABEL, "finished_reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        # Every reason from the start at 0: rate() and absent-series alerts need the series to exist.
        self.finished = {reason: finished.labels(self.model_name, reason.value) for reason in FinishedReason}
        self.request_prompt_tokens = self._histogram(
            "request_prompt_tokens", "Prompt tokens of each completed request.", REQUEST_TOKENS_BUCKETS
        )
        self.request_generation_tokens = self._histogram(
            "request_generation_tokens",
            "Tokens generated for each completed request (all its choices).",
            REQUEST_TOKENS_BUCKETS,
        )

    def observe_engine(self, stats: EngineStats) -> None:
        """The engine's occupancy, read between steps."""
        # The engine's count is cumulative; the counter grows by what is new since the last read.
        self.prefix_cache_hits.inc(
            max(0, stats.prefix_cache_hit_tokens - self._engine_stats.prefix_cache_hit_tokens)
        )
        self.grammar_mask_seconds.inc(
            max(0.0, stats.grammar_mask_seconds - self._engine_stats.grammar_mask_seconds)
        )
        self._engine_stats = stats
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.kv_reserved.set(stats.kv_reserved_tokens)
        self.kv_held.set(stats.kv_held_tokens)
        self.prefix_cache_held.set(stats.prefix_cache_tokens)
        capacity = stats.kv_capacity_tokens
        self.kv_usage.set(stats.kv_reserved_tokens / capacity if capacity > 0 else 0.0)

    def observe_step(self, seconds: float, updates: Sequence[SequenceUpdate]) -> None:
        self.step_seconds.observe(seconds)
        producing = sum(1 for update in updates if update.new_token_ids)
        if producing:
            self.batch_size.observe(producing)
        generated = sum(len(update.new_token_ids) for update in updates)
        self.generation_tokens.inc(generated)
        self._generated += generated

    def observe_acceptance(self, job: GenerationJob, prompt_tokens: int) -> None:
        """A job this worker accepted: its prompt and how long it waited for this worker."""
        self.prompt_tokens.inc(prompt_tokens)
        # created_at is the gateway's clock: skew between hosts shows up here, never below zero.
        self.queue_wait.observe(max(0.0, time.time() - job.created_at))

    def record_failover(self) -> None:
        """Count a job of a dead worker that this worker re-enqueued to be resumed (the reaper calls it)."""
        self.failovers.inc()

    def observe_outcomes(self, events: Iterable[TokenEvent]) -> None:
        """Count the requests these published events ended, with their sizes when they completed."""
        for event in events:
            if isinstance(event, Finished):
                self.finished[finished_reason(event.finish_reason)].inc()
                self.request_prompt_tokens.observe(event.usage.prompt_tokens)
                self.request_generation_tokens.observe(event.usage.completion_tokens)
            elif isinstance(event, Failed):
                self.finished[FinishedReason.ERROR].inc()

    def record_end(self, reason: FinishedReason) -> None:
        """Count a request that ended outside the step loop: aborted by its client, or a worker bug."""
        self.finished[reason].inc()

    def sample_load(self) -> WorkerLoad:
        """Running, waiting and tokens/s since the previous sample; the heartbeat calls it."""
        now, generated = time.monotonic(), self._generated
        since, generated_before = self._load_window
        self._load_window = (now, generated)
        elapsed = now - since
        return WorkerLoad(
            running=self._engine_stats.running,
            waiting=self._engine_stats.waiting,
            generation_tokens_per_s=(generated - generated_before) / elapsed if elapsed > 0 else 0.0,
        )

    def serve(self, port: int, host: str, probes: Probes | None = None) -> MetricsServer:
        """Expose ``/metrics``, and ``probes``' /health and /ready, on ``host:port`` (0: a free port)."""
        exposition = make_wsgi_app(self.registry)
        server, thread = serve_wsgi(exposition if probes is None else probes.route(exposition), port, host)
        metrics_server = MetricsServer(server, thread)
        logger.info("metrics on http://%s:%d/metrics", host, metrics_server.port)
        return metrics_server
