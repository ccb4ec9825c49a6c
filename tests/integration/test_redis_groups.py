"""Model groups with real processes: two Redis servers, one gateway, two workers of two models.

The home Redis (``--redis-url``) is also the group of the first model (named in
``--redis-groups`` with the home URL); the second model's glob sends it to the other
Redis. The gateway must list both, answer both streamed and not, resume a stream and
tokenize through the right group, read API keys from home only, and leave each model's
queue, stream and registry keys in its own group's Redis alone; ``tokenferry status``
shows both groups' workers.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from shared import keys
from shared.access import apikeys
from shared.redis_server import EmbeddedRedis, free_port
from shared.supervisor import Child
from tests.processes import StreamReader, chat_text, run_cli, spawn_cli, stop_all, wait_for_model

START_TIMEOUT_S = 60.0


@pytest.fixture
def two_redis() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis]]:
    with EmbeddedRedis() as home, EmbeddedRedis() as other:
        yield home, other


def _chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, **extra}


def _names(client: redis.Redis, pattern: str) -> set[str]:
    return {name.decode() for name in client.scan_iter(match=pattern, count=1000)}


def _start(home_url: str, groups: dict[str, str], models: tuple[str, str], port: int) -> list[Child]:
    shared = ["--redis-url", home_url, "--redis-groups", json.dumps(groups)]
    return [
        spawn_cli("gateway", *shared, "--port", str(port), "--auth-cache-s", "0"),
        *(
            spawn_cli("worker", *shared, "--engine", "fake", "--model", model, "--worker-id", f"{model}-w")
            for model in models
        ),
    ]


@pytest.mark.timeout(180)
async def test_two_models_in_two_groups_are_served_through_one_gateway(
    two_redis: tuple[EmbeddedRedis, EmbeddedRedis],
) -> None:
    home, other = two_redis
    run = uuid.uuid4().hex[:8]
    model_a, model_b = f"home-{run}", f"grp-b-{run}"
    groups = {model_a: home.url, "grp-b-*": other.url}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    processes = _start(home.url, groups, (model_a, model_b), port)
    try:
        for model in (model_a, model_b):
            wait_for_model(url, processes, model, START_TIMEOUT_S)
        secret = await _create_key(home.url)
        headers = {"authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
            assert (
                await client.get("/v1/models", headers={"authorization": "Bearer nope"})
            ).status_code == 401
            listed = (await client.get("/v1/models")).json()["data"]
            assert {model_a, model_b} <= {card["id"] for card in listed}
            streamed = {model: await _both_ways(client, model) for model in (model_a, model_b)}
            await _resumes(client, model_b, streamed[model_b])
            tokenized = await client.post("/tokenize", json={"model": model_b, "prompt": "Hello there"})
            assert tokenized.status_code == 200, tokenized.text
            assert tokenized.json()["count"] > 0
            await _background_response(client, model_b)
            await _batch(client, model_b)
        _assert_keys_in_their_group(home, other, {model_a: streamed[model_a], model_b: streamed[model_b]})
        status = run_cli(
            "status", "--redis-url", home.url, "--once", env={"TOKENFERRY_REDIS_GROUPS": json.dumps(groups)}
        )
        assert status.returncode == 0, status.stderr
        assert f"{model_a}-w" in status.stdout and f"{model_b}-w" in status.stdout
        assert all(process.poll() is None for process in processes)
    finally:
        stop_all(processes)


async def _create_key(home_url: str) -> str:
    from redis.asyncio import Redis

    client = Redis.from_url(home_url)
    try:
        return (await apikeys.create_key(client, "groups-test")).secret
    finally:
        await client.aclose()


async def _both_ways(client: httpx.AsyncClient, model: str) -> str:
    """Chat with ``model`` unstreamed and streamed (the same text both ways); the stream's request id."""
    whole = await client.post("/v1/chat/completions", json=_chat(model))
    assert whole.status_code == 200, whole.text
    expected = whole.json()["choices"][0]["message"]["content"]
    assert expected
    async with client.stream("POST", "/v1/chat/completions", json=_chat(model, stream=True)) as response:
        assert response.status_code == 200
        stream = StreamReader(response)
        await stream.rest()
    assert stream.events[-1].data == "[DONE]"
    assert chat_text(stream.events) == expected
    return response.headers["x-request-id"]


async def _resumes(client: httpx.AsyncClient, model: str, request_id: str) -> None:
    """A stream of a grouped model resumes by id alone: its view (home) names its group."""
    whole = await client.get(f"/v1/requests/{request_id}/stream")
    assert whole.status_code == 200, whole.text
    events = [line for line in whole.text.splitlines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    assert any(model in line for line in events)


async def _until(client: httpx.AsyncClient, path: str, statuses: set[str]) -> dict[str, object]:
    """GET ``path`` until its ``status`` is one of ``statuses`` (a background job's end)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got: dict[str, object] = (await client.get(path)).json()
        if got["status"] in statuses:
            return got
        await asyncio.sleep(0.2)
    raise AssertionError(f"{path} stayed {got['status']}")


async def _background_response(client: httpx.AsyncClient, model: str) -> None:
    """A background response of a grouped model: its record at home, its job and stream in the group."""
    body = {"model": model, "input": "Hi", "background": True, "max_output_tokens": 12}
    started = await client.post("/v1/responses", json=body)
    assert started.status_code == 200, started.text
    ended = await _until(
        client, f"/v1/responses/{started.json()['id']}", {"completed", "incomplete", "failed"}
    )
    assert ended["status"] != "failed", ended
    assert ended["output"]


async def _batch(client: httpx.AsyncClient, model: str) -> None:
    """A batch of a grouped model's lines: the batch and its files at home, its lines' jobs in the group."""
    lines = [
        {"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions", "body": _chat(model)}
        for n in range(2)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = await client.post(
        "/v1/files", files={"file": ("input.jsonl", content)}, data={"purpose": "batch"}
    )
    assert uploaded.status_code == 200, uploaded.text
    batch = await client.post(
        "/v1/batches",
        json={
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    assert batch.status_code == 200, batch.text
    ended = await _until(client, f"/v1/batches/{batch.json()['id']}", {"completed", "failed", "expired"})
    assert ended["status"] == "completed", ended
    output = await client.get(f"/v1/files/{ended['output_file_id']}/content")
    results = [json.loads(line) for line in output.text.splitlines()]
    assert sorted(result["custom_id"] for result in results) == ["line-0", "line-1"]
    assert all(result["response"]["status_code"] == 200 for result in results)


def _assert_keys_in_their_group(home: EmbeddedRedis, other: EmbeddedRedis, streams: dict[str, str]) -> None:
    (model_a, request_a), (model_b, request_b) = streams.items()
    with redis.Redis.from_url(home.url) as at_home, redis.Redis.from_url(other.url) as in_group:
        # Each model's stream, arq health record and registry entry are in its own group only.
        assert at_home.exists(keys.events(request_a)) and not in_group.exists(keys.events(request_a))
        assert in_group.exists(keys.events(request_b)) and not at_home.exists(keys.events(request_b))
        assert _names(at_home, f"{keys.queue(model_a)}*") and not _names(in_group, f"*{model_a}*")
        assert _names(in_group, f"{keys.queue(model_b)}*") and not _names(at_home, f"*{model_b}*")
        assert set(at_home.hkeys(keys.known_models())) == {model_a.encode()}
        assert set(in_group.hkeys(keys.known_models())) == {model_b.encode()}
        # Tenants' records stay home: the key, and both streams' resumable views.
        assert _names(at_home, f"{keys.api_key('')}*") and not _names(in_group, f"{keys.api_key('')}*")
        assert at_home.exists(keys.request_view(request_a), keys.request_view(request_b)) == 2
        assert not _names(in_group, f"{keys.request_view('')}*")
        for home_only in (keys.batch(""), keys.file(""), keys.response("")):
            assert _names(at_home, f"{home_only}*") and not _names(in_group, f"{home_only}*")
