"""Owns ``python -m bench.stream_clients``: Redis clients and first-read delay with many open streams.

Opens ``--streams`` event streams at once (each has its Accepted event, then waits) and
relays them two ways against a private Redis: each stream read on its own (``EventReader``
over an unbounded pool, the gateway's relay before its shared readers) and through
``StreamMux`` (the gateway's relay now). For each it reports Redis's ``connected_clients``
before and while the streams are open, and that every stream got its whole text once
the events were written. It then measures how long a stream joining the mux waits for
an event already stored while ``--streams`` idle streams keep every reader blocked (a
blocked XREAD does not see a stream that joined after it was sent: ``CLIENT UNBLOCK`` cuts
it short; without that, the wait is up to Redis's ~100 ms tick).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from redis.asyncio import Redis

from shared.jobs import jobqueue
from shared.jobs.stream_mux import BLOCK_MS, StreamMux
from shared.jobs.streams import EventReader, EventWriter, StreamEvent
from shared.protocol import Accepted, Delta, Finished, FinishReason, Usage
from shared.redis_server import EmbeddedRedis

Read = Callable[[str, float], AsyncGenerator[StreamEvent, None]]


async def _clients(redis: Redis) -> int:
    return int((await redis.info("clients"))["connected_clients"])


async def _text(read: Read, request_id: str, deadline: float) -> str:
    return "".join([getattr(item.event, "text", "") async for item in read(request_id, deadline)])


async def _open_streams(redis: Redis, read: Read, count: int, tag: str) -> dict[str, Any]:
    writer = EventWriter(redis)
    ids = [f"{tag}-{index}" for index in range(count)]
    await writer.publish_step(
        [(request_id, Accepted(prompt_tokens=1, worker_id="bench")) for request_id in ids]
    )
    before = await _clients(redis)
    deadline = time.monotonic() + 120
    tasks = [asyncio.create_task(_text(read, request_id, deadline)) for request_id in ids]
    await asyncio.sleep(2)  # every reader has sent its XREAD
    during = await _clients(redis)
    usage = Usage(prompt_tokens=1, completion_tokens=1)
    await writer.publish_step([(request_id, Delta(text="hello", token_ids=[1])) for request_id in ids])
    await writer.publish_step(
        [(request_id, Finished(finish_reason=FinishReason.STOP, usage=usage)) for request_id in ids]
    )
    texts = await asyncio.gather(*tasks)
    return {"clients_before": before, "clients_open": during, "all_full_text": texts == ["hello"] * count}


async def _join_delays(redis: Redis, mux: StreamMux, samples: int) -> dict[str, float]:
    """Seconds from a new stream's read to its first (already stored) event, while the readers block."""
    writer = EventWriter(redis)
    delays = []
    for index in range(samples):
        request_id = f"join-{index}"
        await writer.publish_step([(request_id, Accepted(prompt_tokens=1, worker_id="bench"))])
        started = time.monotonic()
        async for _ in mux.read(request_id, deadline=started + 10):
            break
        delays.append(time.monotonic() - started)
        await asyncio.sleep(0.013)  # land at different points of the readers' blocks
    return {"p50_ms": statistics.median(delays) * 1000, "max_ms": max(delays) * 1000}


async def run(streams: int, readers: int) -> dict[str, Any]:
    with EmbeddedRedis() as server:
        redis = Redis.from_url(server.url)
        pool = await jobqueue.open_pool(server.url)  # unbounded, as the gateway's was
        per_stream = EventReader(pool)
        before = await _open_streams(redis, lambda rid, dl: per_stream.read(rid, deadline=dl), streams, "own")
        await pool.connection_pool.disconnect()  # its 1,000 idle connections
        mux = StreamMux(pool, readers=readers)
        after = await _open_streams(redis, lambda rid, dl: mux.read(rid, deadline=dl), streams, "mux")
        idle_ids = [f"idle-{index}" for index in range(streams)]
        idle = [
            asyncio.create_task(_text(lambda r, d: mux.read(r, deadline=d), rid, time.monotonic() + 60))
            for rid in idle_ids
        ]
        join = await _join_delays(redis, mux, 40)
        for task in idle:
            task.cancel()
        await asyncio.gather(*idle, return_exceptions=True)
        await mux.aclose()
        await pool.aclose()
        await redis.aclose()
    return {
        "streams": streams,
        "readers": readers,
        "block_ms": BLOCK_MS,
        "one_connection_per_stream": before,
        "shared_readers": after,
        "join_delay_with_idle_streams": join,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.streams, args.readers)), indent=2))


if __name__ == "__main__":
    main()
