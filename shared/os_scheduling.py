"""Owns the Linux scheduling policy of tokenferry's relay processes beside a model's compute threads.

On a CPU host the model's OpenMP threads hold every core for a whole forward pass and meet
at barriers. Under Linux's default policy a relay thread that wakes (a token to publish, an
SSE write, a Redis reply) preempts one of them at once, and its partner then waits at the
next barrier: a millisecond taken can cost the model two core-milliseconds. A ``SCHED_BATCH`` thread
never preempts on waking: it runs at once on an idle core (between two forward passes one
is), else at the next scheduler tick, and then takes its fair share as before. Nothing
else about its share changes, and no privilege is needed: a process may move its own
threads, or its children's, between the default policy and ``SCHED_BATCH``.

Who is moved (``worker_batches``): with ``os_scheduling`` ``auto``, a ``--engine vllm``
worker's own threads once vLLM's engine core, a child process of its own, is running, and
under ``tokenferry serve`` the gateway and the private Redis beside it. The native engine's
compute threads live in the worker's process, and its step loop waits for each publish to
Redis: with the gateway and Redis moved, the share of each step spent between steps rose by
about 2 points (``bench.peers``' loop column, four runs), so with the native engine nothing
is moved. A gateway or Redis on hosts of their own is left alone. Threads a moved thread
starts later inherit its policy. Linux only; elsewhere (and in a container that refuses it)
nothing changes and one line is logged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def worker_batches(os_scheduling: str, engine: str) -> bool:
    """Whether a worker's threads, and the relays ``tokenferry serve`` starts beside it, go under SCHED_BATCH.

    ``os_scheduling`` is the worker's setting, ``engine`` its engine.
    """
    return os_scheduling == "batch" or (os_scheduling == "auto" and engine == "vllm")


def batch_relays(*pids: int | None) -> None:
    """Move the relays started beside a worker (a gateway, a private Redis; None: not started here)."""
    for pid in pids:
        if pid is not None:
            batch_threads(pid)


def batch_threads(pid: int | None = None) -> int:
    """Put every thread of process ``pid`` (this one by default) under ``SCHED_BATCH``; how many moved."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None or not Path("/proc/self/task").is_dir():
        logger.info("SCHED_BATCH is not available here; process %s keeps the default policy", pid or "self")
        return 0
    tasks = Path(f"/proc/{pid or os.getpid()}/task")
    if not tasks.is_dir():
        return 0  # the process is gone
    moved = 0
    for task in tasks.iterdir():
        try:
            os.sched_setscheduler(int(task.name), policy, os.sched_param(0))
            moved += 1
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as error:
            logger.info("cannot move thread %s to SCHED_BATCH (%s); it keeps its policy", task.name, error)
    return moved
