"""Owns the gateway's Prometheus metrics: their definitions and how each request feeds them.

Each app builds its own ``GatewayMetrics`` (its own ``CollectorRegistry``) in
``create_app``, so several apps in one process never share or collide on a
metric. ``RequestMetricsMiddleware`` counts every response by route template (not
raw path: a path with ids in it would make a label value per request), model
and status, and keeps the open-streams gauge. The request's model and its token
timings come from two hooks the dispatcher calls, ``note_model`` and
``note_event``, which find the request's record through a contextvar set by the
middleware: the relay runs inside the middleware's call (the SSE body included),
so no object has to be threaded through handlers.

The model label is set only once the dispatcher knows a live worker serves the
model, so a client sending random model names cannot grow the label set; requests
that never got that far have ``model=""``.

Latencies are measured where the gateway sees them: time to first token from the
request's arrival to its first generated token, inter-token latency per token
between deliveries (a delivery carrying n tokens after a gap counts n gaps of
gap/n), end-to-end from arrival to the finished event.

Queue depth is read from Redis at scrape time (``refresh_queue_depths``), with a
short deadline, by one gateway at a time (``gateway/ops/queue_depth.py``); when
Redis does not answer in time the gauge is left out of the scrape rather than
reported stale.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.asgi import HttpMiddleware, on_response_start
from gateway.ops.queue_depth import QueueDepthExport
from shared.protocol import Delta, Finished, TokenEvent

logger = logging.getLogger(__name__)

NAMESPACE = "tokenferry_gateway"
QUEUE_READ_TIMEOUT_S = 1.0
UNMATCHED_ENDPOINT = "unmatched"
# From a warm GPU's first token to a long prompt waiting behind a full CPU batch.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class GatewayMetrics:
    """One gateway app's metrics and their registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._define_traffic()
        self._define_latencies()

    def _define_traffic(self) -> None:
        registry = self.registry
        self.requests = Counter(
            "requests",
            "HTTP responses by route template, model and status code.",
            ["endpoint", "model", "status"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.rate_limited = Counter(
            "rate_limited_requests",
            "Requests answered 429 (rate limit or overload), by route template.",
            ["endpoint"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.open_streams = Gauge(
            "open_streams", "SSE responses being streamed.", ["model"], namespace=NAMESPACE, registry=registry
        )
        self.queue_depths = QueueDepthExport(registry)

    def _define_latencies(self) -> None:
        self.time_to_first_token = self._latency(
            "time_to_first_token_seconds",
            "From the request's arrival to its first generated token.",
            TTFT_BUCKETS,
        )
        self.inter_token_latency = self._latency(
            "inter_token_latency_seconds",
            "Time between successive generated tokens of one request.",
            ITL_BUCKETS,
        )
        self.e2e_latency = self._latency(
            "e2e_request_latency_seconds",
            "From the request's arrival to its last token (finished requests only).",
            E2E_BUCKETS,
        )

    def _latency(self, name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        """A per-model latency histogram of this app's registry."""
        return Histogram(
            name, documentation, ["model"], namespace=NAMESPACE, registry=self.registry, buckets=buckets
        )

    async def refresh_queue_depths(self, redis: Redis, group_redis: Sequence[Redis] = ()) -> None:
        """Re-read every queue's depth (in ``group_redis``: the model groups') if this gateway
        exports it; on a slow or failed read, drop it."""
        try:
            async with asyncio.timeout(QUEUE_READ_TIMEOUT_S):
                await self.queue_depths.refresh(redis, group_redis)
        except (TimeoutError, RedisError) as error:
            logger.warning("queue depths unavailable for /metrics: %r", error)
            self.queue_depths.clear()

    async def release_queue_depths(self, redis: Redis) -> None:
        """Give the queue-depth lease back on the way out; a failure only leaves it to lapse."""
        try:
            async with asyncio.timeout(QUEUE_READ_TIMEOUT_S):
                await self.queue_depths.release(redis)
        except (TimeoutError, RedisError) as error:
            logger.warning("could not give the queue-depth lease back (it lapses by itself): %r", error)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)


@dataclass
class _RequestRecord:
    metrics: GatewayMetrics
    arrived_at: float
    model: str = ""
    has_first_token: bool = False
    # Per choice: with n > 1 choices, gaps are measured within each choice's own tokens.
    last_token_at: dict[int, float] = field(default_factory=dict)


_current: ContextVar[_RequestRecord | None] = ContextVar("request_metrics", default=None)


def note_model(model: str) -> None:
    """The request's model is served: label its metrics with it (no-op outside a request)."""
    record = _current.get()
    if record is not None:
        record.model = model


def note_event(event: TokenEvent) -> None:
    """Time a relayed event: first token, gaps between tokens, the end (no-op outside a request)."""
    record = _current.get()
    if record is None or not record.model:
        return
    now = time.perf_counter()
    metrics = record.metrics
    if isinstance(event, Delta):
        _time_tokens(record, getattr(event, "index", 0), max(1, len(event.token_ids)), now)
    elif isinstance(event, Finished):
        metrics.e2e_latency.labels(record.model).observe(now - record.arrived_at)


def _time_tokens(record: _RequestRecord, choice: int, tokens: int, now: float) -> None:
    metrics = record.metrics
    if not record.has_first_token:
        record.has_first_token = True
        metrics.time_to_first_token.labels(record.model).observe(now - record.arrived_at)
    last = record.last_token_at.get(choice)
    record.last_token_at[choice] = now
    # Tokens delivered together share the gap; a choice's first token has no gap before it.
    gaps = tokens if last is not None else tokens - 1
    gap = 0.0 if last is None else (now - last) / tokens
    for _ in range(gaps):
        metrics.inter_token_latency.labels(record.model).observe(gap)


class RequestMetricsMiddleware(HttpMiddleware):
    """Counts responses and open streams; sets up the per-request record the hooks fill."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = _Exchange(scope, _RequestRecord(self.metrics, time.perf_counter()))
        token = _current.set(exchange.record)
        try:
            await self.app(scope, receive, on_response_start(send, exchange.started))
        finally:
            exchange.close()
            _current.reset(token)


class _Exchange:
    """One HTTP exchange as the metrics see it: its status once sent, whether it streams."""

    def __init__(self, scope: Scope, record: _RequestRecord) -> None:
        self.scope = scope
        self.record = record
        self.status: int | None = None
        self.is_stream = False

    def started(self, message: Message) -> None:
        """The response's start went out: count its status, and whether it opens a stream."""
        self.status = int(message["status"])
        self._count(self.status)
        content_type = Headers(raw=message.get("headers", [])).get("content-type", "")
        self.is_stream = content_type.startswith("text/event-stream")
        if self.is_stream:
            self.record.metrics.open_streams.labels(self.record.model).inc()

    def close(self) -> None:
        if self.status is None:
            self._count(500)  # the app raised before answering; the server answers 500
        if self.is_stream:
            self.record.metrics.open_streams.labels(self.record.model).dec()

    def _count(self, status: int) -> None:
        metrics, endpoint = self.record.metrics, _endpoint(self.scope)
        metrics.requests.labels(endpoint, self.record.model, str(status)).inc()
        if status == 429:
            metrics.rate_limited.labels(endpoint).inc()


def _endpoint(scope: Scope) -> str:
    """The matched route's path template (``/v1/models/{model_id}``), never the raw path."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else UNMATCHED_ENDPOINT
