"""Owns the project's dependency on arq: the only module outside tests that imports it.

arq (0.28, pinned; in maintenance mode upstream) runs our jobs, but only part of
it is used as arq ships it. Replacing arq means rewriting this module and the code
named below; nothing else imports arq, which ``tests/unit/test_dependency_direction.py``
checks. Its Redis keys are spelled in ``shared/keys.py`` (``ARQ_*``), equal to
``arq.constants`` (a unit test checks that too).

What the project relies on arq for:

- **Job functions** (``job_function``, arq's ``func``): a job names its function
  (``generate``, ``tokenize``) and arq's ``Worker.run_job`` runs it. It reads the job
  key, counts tries in the retry key against ``max_tries``, hands the coroutine a
  ctx dict (ours seen through ``worker/queue/jobs.py``'s ``WorkerContext``: arq's
  ``job_id`` and the ``ctx`` entries given to the worker), and once it returns deletes
  the job's keys and queue entry (``keep_result=0``: no result is stored).
- **``Retry``**: a job raising it is run again after ``defer``, up to ``max_tries``
  (``worker/queue/jobs.py``, when Redis fails while a job starts). A job cancelled
  by a shutdown stays queued too (arq's ``retry_jobs``); its next run finds its run
  record handed on and stops (``shared/jobs/run_records.py``).
- **The serializer hooks** ``job_serializer``/``job_deserializer`` on the pool and the
  worker (JSON, ``shared/codec.py``; never arq's pickle), and ``serialize_job``, which
  builds the payload the enqueue script stores.
- **The key layout** the enqueue and claim scripts reproduce: the job key
  (``arq:job:``, expiring after the pool's ``expires_extra_ms``), the queue's sorted set
  scored by enqueue time, which keeps running jobs until they finish, the in-progress
  key (``arq:in-progress:``, living the worker's ``in_progress_timeout_s``), the retry
  count and the result key, whose presence refuses a duplicate id.
- **The abort set** (``arq:abort``, ``allow_abort_jobs``): ``run_job`` drops a job
  listed there before it starts; ``QueueWorker._cancel_aborted_jobs`` (arq's, overridden
  to read only recent entries) cancels the listed jobs it runs (``job_tasks``),
  recording them in ``aborting_tasks`` (``QueueWorker.is_aborting``).
- **``Worker``, which ``QueueWorker`` subclasses** (``worker/queue/consumer.py``): its
  constructor options, ``run_job``, ``heart_beat``, ``_cancel_aborted_jobs``,
  ``close`` (wrapped) and the ``on_startup``/``on_shutdown`` hooks (``worker_hook``),
  ``async_run``/``run``, and the attributes the overrides keep as arq keeps them:
  ``sem``, ``job_counter``, ``tasks``, ``job_tasks``, ``aborting_tasks``, ``allow_pick_jobs``,
  ``max_jobs``, ``in_progress_timeout_s``, ``queue_read_limit``, ``main_task``, ``ctx``.
- **The pool** (``QueuePool``, arq's ``ArqRedis``, opened by ``create_pool`` from
  ``RedisSettings``): arq's client, which is also redis-py's async client that every
  other Redis call of the project goes through.
- **Its log line** for a started job (``arq.worker``, four arguments), whose argument
  text ``worker/queue/jobs.py``'s ``RedactJobArguments`` hides.

What the project does instead of arq:

- **Wake-ups instead of polling**: the worker sleeps until a message on
  ``keys.wake(model)`` or ``keys.ABORTS_CHANNEL``, polling only as a safety net
  (``QueueWorker.main``, which repeats arq's start-up lines around its own loop).
- **The claim script instead of arq's pick** (``worker/queue/claims.py``): one round
  trip claims due jobs as arq claims them, instead of several per job, and sees past
  arq's read limit; **the enqueue script instead of ``enqueue_job``**
  (``shared/jobs/jobqueue.py``): one round trip with the wake-up and the job's place
  in line.
- **Run records and leases instead of the in-progress timeout**: a worker's heartbeat
  is the lease behind the run records of its jobs, and the reaper takes a dead
  worker's jobs over within seconds (``shared/jobs/run_records.py``,
  ``worker/queue/presence.py``, ``worker/queue/reaper.py``), dropping or releasing
  arq's records of the dead attempt (``jobqueue.forget``, ``jobqueue.release``).
- **Riding out Redis outages**: a failed poll is retried with backoff instead of
  ending the worker (``worker/queue/consumer.py``).
- **The drain instead of arq's signal handling**: SIGTERM stops taking jobs, lets
  running ones finish for a grace period, then hands the rest over as their next
  attempt (``QueueWorker.drain``, ``worker/queue/jobs.py``).
- **Aborts** (``shared/jobs/aborts.py``): a cancellation flag, the abort set for each live
  attempt (trimmed to recent entries as it is written), and an announcement, instead of
  arq's ``Job.abort``; a job refused at enqueue is withdrawn unclaimed (``jobqueue.withdraw``).
- **Connection settings** (``jobqueue.redis_settings``) read as redis-py reads a URL,
  instead of arq's ``RedisSettings.from_dsn``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

from arq.connections import ArqRedis, RedisSettings, create_pool, log_redis_info
from arq.jobs import serialize_job
from arq.typing import StartupShutdown, WorkerCoroutine
from arq.worker import Function, Retry, Worker, func

__all__ = [
    "Function",
    "QueuePool",
    "RedisSettings",
    "Retry",
    "StartupShutdown",
    "Worker",
    "create_pool",
    "job_function",
    "log_redis_info",
    "serialize_job",
    "worker_hook",
]

# arq's pool under our name: the queue's Redis client, also a plain async Redis client.
QueuePool = ArqRedis

Context = TypeVar("Context", bound=Mapping[str, object])


def job_function(
    coroutine: Callable[[Context, Any], Awaitable[None]], *, name: str, max_tries: int
) -> Function:
    """arq's ``func`` for a job coroutine taking its ctx and the job's JSON payload.

    arq types ctx as a plain dict; the coroutine reads the same dict through its ``TypedDict``.
    """
    return func(cast(WorkerCoroutine, coroutine), name=name, max_tries=max_tries)


def worker_hook(hook: Callable[[], Awaitable[None]]) -> StartupShutdown:
    """A start-up or shut-down hook for arq's ``Worker``, which calls it with its ctx (unused)."""

    async def call(ctx: dict[Any, Any]) -> None:
        await hook()

    return call
