"""The runner on a real Redis: bounded retries of a failing driver, outages not counted, leases kept
while a driver works on a thread; and a batch input file read back in chunks of whole lines."""

from __future__ import annotations

import asyncio
import threading

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.background.runner import Runner
from gateway.batches import input_file
from gateway.batches.files import FileStore
from gateway.batches.input_check import FileCheck, InvalidBatchFile
from gateway.batches.input_file import InputFile
from gateway.batches.lines import LineRules
from shared import keys
from tests.helpers import in_background, until

KIND = "thing"
ITEM = "item-1"


async def test_a_driver_that_keeps_raising_is_given_up_after_max_failures(redis: Redis) -> None:
    drives: list[str] = []
    given_up: list[tuple[str, int]] = []

    async def driver(item: str) -> None:
        drives.append(item)
        raise RuntimeError("a bug")

    async def give_up(item: str, failures: int) -> None:
        given_up.append((item, failures))
        await redis.srem(keys.active(KIND), item)  # type: ignore[misc]

    await redis.sadd(keys.active(KIND), ITEM)  # type: ignore[misc]
    runner = Runner(
        redis, {KIND: driver}, give_ups={KIND: give_up}, poll_s=0.02, max_failures=3, first_backoff_s=0.05
    )
    async with in_background(runner.run()):

        async def gave_up() -> bool:
            return bool(given_up)

        await until(gave_up)
        await until(lambda: _gone(redis, keys.runner_lease(KIND, ITEM)))

    assert drives == [ITEM] * 3 and given_up == [(ITEM, 3)]
    assert not await redis.exists(keys.runner_failures(KIND, ITEM))


async def test_redis_outages_are_not_counted_as_failures_of_the_item(redis: Redis) -> None:
    drives: list[str] = []
    given_up: list[str] = []

    async def driver(item: str) -> None:
        drives.append(item)
        if len(drives) <= 5:
            raise RedisConnectionError("Redis is restarting")
        await redis.srem(keys.active(KIND), item)  # type: ignore[misc]

    async def give_up(item: str, failures: int) -> None:
        given_up.append(item)

    await redis.sadd(keys.active(KIND), ITEM)  # type: ignore[misc]
    runner = Runner(
        redis, {KIND: driver}, give_ups={KIND: give_up}, poll_s=0.02, max_failures=2, first_backoff_s=0.05
    )
    async with in_background(runner.run()):
        await until(lambda: _gone(redis, keys.active(KIND)))

    assert len(drives) == 6 and given_up == []


async def test_a_driver_busy_on_a_thread_keeps_its_lease_from_another_runner(redis: Redis) -> None:
    """Three lease lives of work on a thread: the lease is renewed meanwhile, so the item is driven once."""
    LEASE_S = 0.3
    started: list[str] = []
    busy, release = threading.Event(), threading.Event()

    def long_work() -> None:
        busy.set()
        release.wait(30)

    async def driver(item: str) -> None:
        started.append(item)
        await asyncio.to_thread(long_work)
        await redis.srem(keys.active(KIND), item)  # type: ignore[misc]

    await redis.sadd(keys.active(KIND), ITEM)  # type: ignore[misc]
    runners = [Runner(redis, {KIND: driver}, poll_s=0.02, lease_s=LEASE_S) for _ in range(2)]
    try:
        async with in_background(runners[0].run()), in_background(runners[1].run()):
            await asyncio.to_thread(busy.wait, 30)
            await asyncio.sleep(3 * LEASE_S)  # long enough for an unrenewed lease to lapse
            assert started == [ITEM]
            release.set()
            await until(lambda: _gone(redis, keys.active(KIND)))
    finally:
        release.set()
    assert started == [ITEM]


async def test_an_input_file_is_read_in_chunks_of_whole_lines(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(input_file, "CHUNK_BYTES", 16)  # shorter than every line, and than the long one
    rows = [b'{"a": 1}', b"", b'{"b": "' + b"x" * 100 + b'"}', b"  ", b'{"c": 3}']
    content = b"\n".join(rows)  # no newline at the end
    files = FileStore(redis, retention_s=60)
    meta = await files.create("tenant", "in.jsonl", "batch", content)
    fed: list[tuple[int, bytes]] = []

    def feed(self: FileCheck, chunk: bytes, offset: int) -> None:
        fed.append((offset, chunk))

    monkeypatch.setattr(FileCheck, "feed", feed)
    with pytest.raises(InvalidBatchFile):  # nothing was checked: the file counts as empty
        await InputFile(files, meta.id).validate(LineRules("/v1/completions", 16, None), _yes)
    index = await InputFile(files, meta.id).index()

    assert b"".join(chunk for _, chunk in fed) == content
    assert all(content[offset:].startswith(chunk) for offset, chunk in fed)
    assert all(chunk.endswith(b"\n") for _, chunk in fed[:-1])
    assert len(index) == 3 and index.numbers(0, 3) == [1, 3, 5]
    start, end = index.span(1, 1)
    assert content[start:end].strip() == rows[2]


async def _yes() -> bool:
    return True


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)
