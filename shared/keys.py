"""Owns the Redis key schema: every tokenferry key name and TTL is spelled here.

| key                          | type   | writer  | reader          | TTL / owner                          |
|------------------------------|--------|---------|-----------------|--------------------------------------|
| tf:queue:{model}:{lane}      | zset   | gateway | worker (arq)    | arq owns entries                     |
| tf:events:{request_id}       | stream | worker  | gateway         | EVENTS_TTL_S, re-armed at the end    |
| tf:worker:{worker_id}        | string | worker  | gateway         | WORKER_TTL_S, refreshed by heartbeat |
| tf:workers                   | set    | worker  | gateway         | members pruned by readers when stale |
| tf:models:known              | hash   | worker  | gateway         | model -> last seen (s); KNOWN_TTL_S   |

arq's own keys (``arq:job:*``, ``arq:in-progress:*``, ``arq:abort``) are named by arq;
only ``shared/jobqueue.py`` and ``worker/jobs.py`` touch them.
"""

from __future__ import annotations

from enum import StrEnum

PREFIX = "tf:"

# A stream outlives its request long enough for a slow or reconnecting reader.
EVENTS_TTL_S = 600
# While a request runs, its stream must not expire under a long generation.
EVENTS_RUNNING_TTL_S = 3600
# Entries kept per stream: a request never produces more events than tokens plus two.
EVENTS_MAXLEN = 100_000
# Three missed heartbeats and the worker counts as gone.
WORKER_TTL_S = 6
# A model seen recently but with no live worker answers 503, not 404.
KNOWN_TTL_S = 86_400


class Lane(StrEnum):
    """Separate queues so batch work never delays interactive requests."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


def queue(model: str, lane: Lane = Lane.INTERACTIVE) -> str:
    return f"{PREFIX}queue:{model}:{lane}"


def events(request_id: str) -> str:
    return f"{PREFIX}events:{request_id}"


def worker(worker_id: str) -> str:
    return f"{PREFIX}worker:{worker_id}"


def workers_index() -> str:
    return f"{PREFIX}workers"


def known_models() -> str:
    return f"{PREFIX}models:known"
