"""What clients may not learn, against a real Redis: internal exception text and addresses; and deadlines.

A failure's detail goes to the server's log; the client gets a message that
names what happened, never a traceback's text or where Redis lives.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from gateway.http.app import create_app
from shared import keys
from shared.errors import WorkerFailed
from shared.jobs.replies import await_reply
from shared.redis_server import EmbeddedRedis
from shared.settings import GatewaySettings
from tests.helpers import FAKE_MODEL, chat_body, running_stack
from worker.driver.lifecycle import JobLifecycle
from worker.queue.jobs import WORKER_FAILED_MESSAGE

SECRET_DETAIL = "cannot open /srv/models/private.bin via redis://:hunter2@10.1.2.3:6379"


async def test_a_bug_in_the_worker_reaches_the_client_as_a_generic_error(
    redis: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken_start(self: JobLifecycle, job: Any) -> None:
        raise RuntimeError(SECRET_DETAIL)

    caplog.set_level(logging.INFO)
    async with running_stack(redis_url) as client:
        monkeypatch.setattr(JobLifecycle, "start", broken_start)
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=3))

    error = response.json()["error"]
    assert response.status_code == 500 and error["code"] == "worker_failed"
    assert error["message"] == WORKER_FAILED_MESSAGE
    assert "10.1.2.3" not in response.text and "private.bin" not in response.text
    assert SECRET_DETAIL in caplog.text  # the operator still learns what happened


async def test_an_unreadable_worker_reply_is_a_generic_error(redis: Redis) -> None:
    await redis.rpush(keys.reply("req-1"), b'{"not": "a reply"}')  # type: ignore[misc]

    with pytest.raises(WorkerFailed) as failed:
        await await_reply(redis, "req-1", timeout_s=5)

    assert failed.value.message == "The worker's answer could not be read; please retry."


async def test_a_lost_redis_is_a_503_that_names_no_address(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with EmbeddedRedis() as private_redis:
        app = create_app(GatewaySettings(redis_url=private_redis.url, auth_cache_s=0))
        async with app.router.lifespan_context(app):
            private_redis.stop()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                answers = [await client.get("/v1/models"), await client.post("/v1/files")]

    for answer in answers:
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "service_unavailable"
        assert str(private_redis.port) not in answer.text and "127.0.0.1" not in answer.text
    assert str(private_redis.port) in caplog.text  # logged for the operator


async def test_a_background_response_has_a_deadline_like_every_job(redis: Redis, redis_url: str) -> None:
    # A deadline shorter than any queue wait: a job enqueued without one would run and complete.
    async with running_stack(redis_url, gateway={"request_timeout_s": 1e-6}) as client:
        created = await client.post(
            "/v1/responses",
            json={"model": FAKE_MODEL, "input": "Hi", "max_output_tokens": 5, "background": True},
        )
        response_id = created.json()["id"]
        async with asyncio.timeout(20):
            while True:  # the runner settles it from the job's events: polled, with a deadline
                settled = (await client.get(f"/v1/responses/{response_id}")).json()
                if settled["status"] not in ("queued", "in_progress"):
                    break
                await asyncio.sleep(0.05)

    assert created.status_code == 200 and created.json()["status"] == "queued"
    assert settled["status"] == "failed"
    assert settled["error"]["code"] == "timeout"
