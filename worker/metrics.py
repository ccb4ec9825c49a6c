"""Owns the worker's Prometheus metrics and its load summary for the heartbeat.

The driver feeds it between engine steps (``observe_engine``, ``observe_step``,
``observe_acceptance``); nothing here runs inside the engine step itself, so the
compute thread never touches prometheus_client. Each worker builds its own
``CollectorRegistry`` (several in-process workers in tests never collide), and
serves it on ``--metrics-port`` with prometheus_client's WSGI app, the worker's
/health and /ready probes beside it (``worker/probes.py``).

Intentional divergence: the metrics port is off by default. A host often runs
several workers (one per GPU, or the all-in-one ``serve`` beside tests), and a
fixed default port would make the second one fail to start; operators name the
port in their manifests (9100 in deploy/) and scrape it.

Tokens per second is not a metric: Prometheus derives it from the token
counters with ``rate()``. The heartbeat's ``generation_tokens_per_s`` is the same
rate over the last heartbeat interval, for ``tokenferry status``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from shared.protocol import GenerationJob
from shared.registry import WorkerLoad
from worker.engine import EngineStats, SequenceUpdate
from worker.probes import Probes, serve_wsgi

logger = logging.getLogger(__name__)

NAMESPACE = "tokenferry_worker"
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# From a fast decode step on a GPU (a few ms) to a long CPU prefill chunk.
STEP_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
QUEUE_WAIT_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


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
    """One worker's metrics; all ``observe_*`` calls come from the event loop's thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._define_gauges()
        self._define_flows()
        # Plain copies for the heartbeat: prometheus_client has no public read of a value.
        self._engine_stats = EngineStats(running=0, waiting=0)
        self._generated = 0
        self._load_window = (time.monotonic(), 0)

    def _define_gauges(self) -> None:
        registry = self.registry
        self.running = Gauge(
            "running_sequences", "Sequences in the running batch.", namespace=NAMESPACE, registry=registry
        )
        self.waiting = Gauge(
            "waiting_sequences",
            "Sequences added to the engine, waiting to join the batch.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.kv_reserved = Gauge(
            "kv_cache_reserved_tokens",
            "KV-cache positions the running sequences may grow to (prompt + max new tokens, padded).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.kv_usage = Gauge(
            "kv_cache_usage_ratio",
            "Reserved KV-cache positions over the --max-batch-tokens budget (0 without a shared cache).",
            namespace=NAMESPACE,
            registry=registry,
        )

    def _define_flows(self) -> None:
        registry = self.registry
        self.batch_size = Histogram(
            "batch_size",
            "Sequences that produced a token in one engine step.",
            namespace=NAMESPACE,
            registry=registry,
            buckets=BATCH_SIZE_BUCKETS,
        )
        self.step_seconds = Histogram(
            "step_duration_seconds",
            "Wall time of one engine step (one forward pass).",
            namespace=NAMESPACE,
            registry=registry,
            buckets=STEP_SECONDS_BUCKETS,
        )
        self.queue_wait = Histogram(
            "queue_wait_seconds",
            "From the job's creation at the gateway to its start on this worker.",
            namespace=NAMESPACE,
            registry=registry,
            buckets=QUEUE_WAIT_SECONDS_BUCKETS,
        )
        self.prompt_tokens = Counter(
            "prompt_tokens", "Prompt tokens of accepted requests.", namespace=NAMESPACE, registry=registry
        )
        self.generation_tokens = Counter(
            "generation_tokens", "Tokens generated.", namespace=NAMESPACE, registry=registry
        )
        self.prefix_cache_hits = Counter(
            "prefix_cache_hit_tokens",
            "Prompt tokens whose KV was reused from the prefix cache instead of prefilled.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.failovers = Counter(
            "failovers",
            "Jobs of dead workers this worker's reaper put back in the queue to be resumed.",
            namespace=NAMESPACE,
            registry=registry,
        )

    def observe_engine(self, stats: EngineStats) -> None:
        """The engine's occupancy, read between steps."""
        # The engine's count is cumulative; the counter grows by what is new since the last read.
        self.prefix_cache_hits.inc(
            max(0, stats.prefix_cache_hit_tokens - self._engine_stats.prefix_cache_hit_tokens)
        )
        self._engine_stats = stats
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.kv_reserved.set(stats.kv_reserved_tokens)
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
