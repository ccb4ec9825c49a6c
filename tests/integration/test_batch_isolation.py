"""A bad batch hurts nobody: its lines go through the interactive requests' checks, a poison line fails
the batch once (never retried), a failing driver still lets a cancel end it, and validating a large
file leaves the gateway answering. In-process gateway and fake-engine worker on a real Redis."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from gateway.batches import run
from gateway.batches.input_check import FileCheck
from shared import keys
from tests.helpers import FAKE_MODEL, running_stack

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
DEADLINE_S = 60


def chat_line(custom_id: str, **body: object) -> dict[str, Any]:
    request = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **body}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": request}


async def create_batch(client: httpx.AsyncClient, lines: list[dict[str, Any]], endpoint: str = CHAT) -> str:
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = await client.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    )
    assert uploaded.status_code == 200, uploaded.text
    body = {"input_file_id": uploaded.json()["id"], "endpoint": endpoint, "completion_window": "24h"}
    created = await client.post("/v1/batches", json=body)
    assert created.status_code == 200, created.text
    return str(created.json()["id"])


async def wait_for(client: httpx.AsyncClient, batch_id: str, statuses: set[str]) -> dict[str, Any]:
    async with asyncio.timeout(DEADLINE_S):
        while True:
            batch: dict[str, Any] = (await client.get(f"/v1/batches/{batch_id}")).json()
            if batch["status"] in statuses:
                return batch
            await asyncio.sleep(0.05)


async def output_lines(client: httpx.AsyncClient, file_id: str) -> list[dict[str, Any]]:
    content = (await client.get(f"/v1/files/{file_id}/content")).text
    return [json.loads(line) for line in content.splitlines()]


def count_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per validation of an input file (a ``FileCheck`` made)."""
    made: list[int] = []
    original = FileCheck.__init__

    def init(self: FileCheck, *args: Any) -> None:
        made.append(1)
        original(self, *args)

    monkeypatch.setattr(FileCheck, "__init__", init)
    return made


async def test_a_poison_line_fails_its_batch_once_and_a_good_batch_beside_it_completes(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    validations = count_validations(monkeypatch)
    async with running_stack(redis_url) as client:
        poison = [chat_line("fine"), chat_line("poison", logit_bias={"\u00b2": 5}), chat_line("also-fine")]
        poisoned = await create_batch(client, poison)
        good = await create_batch(client, [chat_line(f"good-{index}") for index in range(12)])

        failed = await wait_for(client, poisoned, {"failed", "completed", "cancelled"})
        done = await wait_for(client, good, {"completed", "failed"})

        assert failed["status"] == "failed" and failed["output_file_id"] is None
        [error] = failed["errors"]["data"]
        assert error["line"] == 2 and error["code"] == "invalid_request"
        assert str(error["param"]).startswith("body")
        # Never to be tried again: no runner lists it, and no failure of its driver was counted.
        assert not await redis.sismember(keys.active("batch"), poisoned)  # type: ignore[misc]
        assert not await redis.exists(keys.runner_failures("batch", poisoned))
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 12
        written = await output_lines(client, done["output_file_id"])
        assert sorted(line["custom_id"] for line in written) == sorted(f"good-{index}" for index in range(12))
        assert all(line["response"]["status_code"] == 200 for line in written)
    assert len(validations) == 2  # each file validated once: the poisoned one was not parsed again


async def test_a_line_asking_more_choices_than_allowed_is_refused_like_the_request(redis_url: str) -> None:
    body = {"model": FAKE_MODEL, "prompt": ["a", "b", "c", "d"], "n": 100, "max_tokens": 2}
    async with running_stack(redis_url) as client:
        interactive = await client.post(COMPLETIONS, json=body)
        line = {"custom_id": "wide", "method": "POST", "url": COMPLETIONS, "body": body}
        batch_id = await create_batch(client, [line], endpoint=COMPLETIONS)

        failed = await wait_for(client, batch_id, {"failed", "completed"})

    assert interactive.status_code == 400
    refusal = interactive.json()["error"]
    assert failed["status"] == "failed" and failed["request_counts"]["completed"] == 0
    [error] = failed["errors"]["data"]
    assert (error["line"], error["message"], error["param"]) == (1, refusal["message"], refusal["param"])


async def test_cancel_ends_cancelled_a_batch_whose_driver_keeps_failing(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: run.BatchRun) -> None:
        raise RuntimeError("a bug in the driver")

    monkeypatch.setattr(run.BatchRun, "run", broken)
    async with running_stack(redis_url) as client:
        batch_id = await create_batch(client, [chat_line(f"line-{index}") for index in range(3)])
        await wait_for(client, batch_id, {"in_progress"})
        async with asyncio.timeout(DEADLINE_S):  # its driver has failed at least once
            while True:
                if await redis.exists(keys.runner_failures("batch", batch_id)):
                    break
                await asyncio.sleep(0.05)

        cancelling = await client.post(f"/v1/batches/{batch_id}/cancel")
        cancelled = await wait_for(client, batch_id, {"cancelled", "failed", "completed"})

    assert cancelling.json()["status"] in ("cancelling", "cancelled")
    assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"]
    assert not await redis.sismember(keys.active("batch"), batch_id)  # type: ignore[misc]


async def test_a_batch_whose_driver_keeps_failing_fails_saying_so(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    drives: list[int] = []

    async def broken(self: run.BatchRun) -> None:
        drives.append(1)
        raise RuntimeError("a bug in the driver")

    monkeypatch.setattr(run.BatchRun, "run", broken)
    async with running_stack(redis_url) as client:
        batch_id = await create_batch(client, [chat_line("only")])

        failed = await wait_for(client, batch_id, {"failed", "completed", "cancelled"})

    assert failed["status"] == "failed"
    [error] = failed["errors"]["data"]
    assert error["code"] == "server_error" and "failed on it" in error["message"]
    assert "a bug in the driver" not in error["message"]  # internal text stays in the log
    assert len(drives) == 5  # the runner's bound on failures in a row
    assert not await redis.sismember(keys.active("batch"), batch_id)  # type: ignore[misc]


class HeldValidation:
    """Validation held inside its second chunk, on its thread, until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.chunks: list[int] = []
        original = FileCheck.feed

        def feed(check: FileCheck, chunk: bytes, offset: int) -> None:
            self.chunks.append(offset)
            if len(self.chunks) == 2:
                self.inside.set()
                self.release.wait(DEADLINE_S)
            original(check, chunk, offset)

        monkeypatch.setattr(FileCheck, "feed", feed)

    async def reached(self) -> None:
        assert await asyncio.to_thread(self.inside.wait, DEADLINE_S)


async def test_the_gateway_answers_while_a_large_file_validates(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    LINES = 60_000
    held = HeldValidation(monkeypatch)
    lines = [chat_line(f"line-{index}") for index in range(LINES - 1)] + [chat_line("last", temperature=7)]
    try:
        async with running_stack(redis_url) as client:
            batch_id = await create_batch(client, lines)
            await held.reached()

            async with asyncio.timeout(10):
                health = await client.get("/health")
            mid_way = (await client.get(f"/v1/batches/{batch_id}")).json()
            held.release.set()
            failed = await wait_for(client, batch_id, {"failed", "in_progress", "completed"})
    finally:
        held.release.set()

    assert health.status_code == 200 and mid_way["status"] == "validating"
    assert len(held.chunks) > 2  # validation went on through the rest of the file afterwards
    assert failed["status"] == "failed"
    assert [error["line"] for error in failed["errors"]["data"]] == [LINES]


async def test_cancel_mid_validation_stops_it_and_ends_cancelled(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldValidation(monkeypatch)
    lines = [chat_line(f"line-{index}") for index in range(20_000)]  # over 2 MB: three chunks or more
    try:
        async with running_stack(redis_url) as client:
            batch_id = await create_batch(client, lines)
            await held.reached()
            cancelling = (await client.post(f"/v1/batches/{batch_id}/cancel")).json()
            held.release.set()
            cancelled = await wait_for(client, batch_id, {"cancelled", "failed", "completed"})
    finally:
        held.release.set()

    assert cancelling["status"] == "cancelling"
    assert cancelled["status"] == "cancelled" and cancelled["request_counts"]["completed"] == 0
    assert len(held.chunks) == 2  # the rest of the file was not checked
    assert not await redis.sismember(keys.active("batch"), batch_id)  # type: ignore[misc]
