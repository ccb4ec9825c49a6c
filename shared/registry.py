"""Owns worker registration: the worker's heartbeat (write side) and live-model lookups (read side).

A worker's record is a key with a short TTL refreshed by its heartbeat, so a dead
worker disappears within ``keys.WORKER_TTL_S`` without anyone cleaning up. A set
indexes the records; readers prune members whose record has expired. Models seen
in the last day are remembered so a request for a model whose workers are all
gone gets 503 (come back later), while a model nobody ever served gets 404.

A worker answers to its model's name and to its aliases (``--served-model-name a b``:
``a`` is the model, ``b`` an alias). Queues, run records and metrics are keyed by the
model alone; ``serving`` is the one place a requested name becomes that model.

Each heartbeat also carries the worker's load (running and waiting sequences,
tokens/s) for ``tokenferry status``, and its engine with the generation parameters
that engine refuses (the gateway's 400 before queueing); the fields are optional so
records written and read by older processes still parse.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, ValidationError
from redis.asyncio import Redis

from shared import keys


class WorkerLoad(BaseModel):
    """A worker's load as of its latest heartbeat."""

    model_config = ConfigDict(frozen=True)

    running: int = 0
    waiting: int = 0
    generation_tokens_per_s: float = 0.0


class WorkerInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    worker_id: str
    model: str  # the canonical name: queues and everything else keyed by a model use it
    aliases: tuple[str, ...] = ()  # other names clients may ask for; absent from older records
    max_model_len: int
    started_at: float
    heartbeat_at: float | None = None  # stamped by ``heartbeat``
    load: WorkerLoad | None = None
    # Draining (SIGTERM): alive, finishing its jobs, taking no new ones; not capacity.
    draining: bool = False
    # Its engine, and the generation parameters that engine cannot honour (``shared/engines.py``).
    engine: str = "transformers"
    refuses: tuple[str, ...] = ()

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name the worker answers to, its model's first."""
        return (self.model, *self.aliases)


class ModelAvailability(StrEnum):
    LIVE = "live"
    KNOWN = "known"  # served recently, no live worker now
    UNKNOWN = "unknown"


async def heartbeat(redis: Redis, info: WorkerInfo) -> None:
    """Announce (or re-announce) a live worker; call every ``WORKER_TTL_S / 3`` seconds."""
    record = info.model_copy(update={"heartbeat_at": time.time()})
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(keys.worker(info.worker_id), record.model_dump_json(), ex=keys.WORKER_TTL_S)
        pipe.sadd(keys.workers_index(), info.worker_id)
        pipe.hset(keys.known_models(), mapping=dict.fromkeys(info.served_names, str(time.time())))
        pipe.expire(keys.known_models(), keys.KNOWN_TTL_S)
        await pipe.execute()


async def deregister(redis: Redis, worker_id: str) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.delete(keys.worker(worker_id))
        pipe.srem(keys.workers_index(), worker_id)
        await pipe.execute()


# The index's members, each followed by its record ('' once expired): one round trip, as
# every request asks it. ARGV[1] is the records' key prefix.
_INDEXED_RECORDS = """
local records = {}
for _, worker_id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    records[#records + 1] = worker_id
    records[#records + 1] = redis.call('GET', ARGV[1] .. worker_id) or ''
end
return records
"""


async def live_workers(redis: Redis) -> list[WorkerInfo]:
    """Workers whose heartbeat has not expired, pruning the index of those that have."""
    reply: list[bytes] = await redis.eval(  # type: ignore[misc]
        _INDEXED_RECORDS, 1, keys.workers_index(), keys.worker("")
    )
    live: list[WorkerInfo] = []
    stale: list[str] = []
    for worker_id, record in zip(reply[::2], reply[1::2], strict=True):
        info = _parse(record or None)
        if info is None:
            stale.append(_text(worker_id))
        else:
            live.append(info)
    if stale:
        await redis.srem(keys.workers_index(), *stale)  # type: ignore[misc]
    return live


async def model_availability(redis: Redis, model: str) -> tuple[ModelAvailability, WorkerInfo | None]:
    """Whether ``model`` (a model or an alias) has a live worker (returned: its ``model`` is the
    canonical name), was served recently, or is unknown."""
    workers = await live_workers(redis)
    info = serving(model, workers)
    if info is not None:
        return ModelAvailability.LIVE, with_pool_refusals(info, workers)
    seen_at: bytes | None = await redis.hget(keys.known_models(), model)  # type: ignore[misc]
    if seen_at is not None and time.time() - float(seen_at) < keys.KNOWN_TTL_S:
        return ModelAvailability.KNOWN, None
    return ModelAvailability.UNKNOWN, None


def serving(name: str, workers: Iterable[WorkerInfo]) -> WorkerInfo | None:
    """A worker, not draining, that answers to ``name``; one whose model it is before one whose alias.

    Two models claiming one alias is a misconfiguration: the model whose name it is wins, and
    between aliases the first worker listed does.
    """
    taking = [info for info in workers if not info.draining and name in info.served_names]
    return next((info for info in taking if info.model == name), taking[0] if taking else None)


def with_pool_refusals(info: WorkerInfo, workers: Iterable[WorkerInfo]) -> WorkerInfo:
    """``info`` refusing what any live worker of its model refuses: they share one queue, and
    whichever claims a job must honour it (a pool mixing engines refuses what either cannot)."""
    pool = [other for other in workers if other.model == info.model and not other.draining]
    refuses = tuple(dict.fromkeys(name for other in pool for name in other.refuses))
    engines = sorted({other.engine for other in pool if other.refuses})
    if refuses == info.refuses:
        return info
    return info.model_copy(update={"refuses": refuses, "engine": "/".join(engines) or info.engine})


def served_names(workers: Iterable[WorkerInfo]) -> list[str]:
    """Every name the workers answer to, sorted, once each (what a misspelt model's 404 lists)."""
    return sorted({name for info in workers for name in info.served_names})


def _parse(record: bytes | str | None) -> WorkerInfo | None:
    if record is None:
        return None
    try:
        return WorkerInfo.model_validate_json(record)
    except ValidationError:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
