"""One tenant's bad input never costs another anything: a mixed run on one shared worker.

Tenant B sends every kind of bad request the hardening refuses (token ids past the
vocabulary, a huge beam count, a non-finite float, a logit_bias key that is not a
decimal token id, a 20,000-character stop string) and a poisoned batch, interleaved
with tenant A's streams and a good batch on the same worker. Every request of B is
refused alone with a 400 naming its field; every stream and batch line of A finishes
with its full text.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from redis.asyncio import Redis

from shared.settings import WorkerSettings
from tests.helpers import FAKE_MODEL, bearer, parse_sse, running_stack

KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-0123456789"
SCRIPT = WorkerSettings.model_fields["fake_script"].default
MAX_TOKENS = 24
GOOD_STREAMS = 6
BATCH_TIMEOUT_S = 90.0


def _chat(content: str = "Hi", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": content}]}
    return body | {"max_tokens": MAX_TOKENS} | extra


def _expected_text() -> str:
    return SCRIPT.encode()[:MAX_TOKENS].decode()


# Each bad request of tenant B: (route, raw JSON body). Raw, so that 1e999 reaches the server.
BAD_REQUESTS: list[tuple[str, str]] = [
    ("/v1/completions", json.dumps({"model": FAKE_MODEL, "prompt": [1, 2, 10**9], "max_tokens": 4})),
    ("/v1/chat/completions", json.dumps(_chat(num_beams=1_000_000))),
    (
        "/v1/chat/completions",
        json.dumps(_chat()).replace('"max_tokens"', '"repetition_penalty": 1e999, "max_tokens"'),
    ),
    ("/v1/chat/completions", json.dumps(_chat(logit_bias={"²": 1}))),
    ("/v1/chat/completions", json.dumps(_chat(stop=["x" * 20_000]))),
]


async def _good_stream(client: httpx.AsyncClient, index: int) -> tuple[str, str | None]:
    body = _chat(f"stream {index}", stream=True)
    response = await client.post("/v1/chat/completions", json=body, headers=bearer(KEY_A))
    assert response.status_code == 200, response.text
    chunks = [chunk for chunk in parse_sse(response.text) if isinstance(chunk, dict)]
    text = "".join(choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"])
    reasons = [
        choice["finish_reason"] for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]
    ]
    return text, reasons[-1] if reasons else None


async def _bad_request(client: httpx.AsyncClient, route: str, body: str) -> httpx.Response:
    headers = bearer(KEY_B) | {"content-type": "application/json"}
    return await client.post(route, content=body, headers=headers)


async def _submit_batch(client: httpx.AsyncClient, key: str, lines: list[dict[str, Any]]) -> str:
    content = "\n".join(json.dumps(line) for line in lines).encode()
    upload = await client.post(
        "/v1/files",
        files={"file": ("input.jsonl", content, "application/jsonl")},
        data={"purpose": "batch"},
        headers=bearer(key),
    )
    assert upload.status_code == 200, upload.text
    created = await client.post(
        "/v1/batches",
        json={
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        headers=bearer(key),
    )
    assert created.status_code == 200, created.text
    return str(created.json()["id"])


def _line(custom_id: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": _chat(**body)}


async def _finished_batch(client: httpx.AsyncClient, key: str, batch_id: str) -> dict[str, Any]:
    async with asyncio.timeout(BATCH_TIMEOUT_S):
        while True:
            batch = (await client.get(f"/v1/batches/{batch_id}", headers=bearer(key))).json()
            if batch["status"] in {"completed", "failed", "expired", "cancelled"}:
                return dict(batch)
            await asyncio.sleep(0.1)


async def _file_lines(client: httpx.AsyncClient, key: str, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.get(f"/v1/files/{file_id}/content", headers=bearer(key))
    return [json.loads(line) for line in content.text.splitlines() if line]


async def test_bad_requests_and_a_poisoned_batch_leave_another_tenants_streams_and_batch_whole(
    redis: Redis, redis_url: str
) -> None:
    gateway = {"api_keys": [KEY_A, KEY_B]}
    async with running_stack(redis_url, gateway=gateway, fake_step_delay_s=0.01, max_batch_size=16) as client:
        good_batch = await _submit_batch(client, KEY_A, [_line(f"good-{index}") for index in range(4)])
        poisoned = [_line("poison", logit_bias={"²": 1}), _line("fine")]
        poisoned_batch = await _submit_batch(client, KEY_B, poisoned)
        streams = [asyncio.ensure_future(_good_stream(client, index)) for index in range(GOOD_STREAMS)]
        refusals = [await _bad_request(client, route, body) for route, body in BAD_REQUESTS]
        results = await asyncio.gather(*streams)
        good = await _finished_batch(client, KEY_A, good_batch)
        bad = await _finished_batch(client, KEY_B, poisoned_batch)
        good_output = await _file_lines(client, KEY_A, good["output_file_id"])
        bad_errors = await _file_lines(client, KEY_B, bad.get("error_file_id"))

    for refusal in refusals:
        assert refusal.status_code == 400, refusal.text
        error = refusal.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"], error
    assert results == [(_expected_text(), "length")] * GOOD_STREAMS
    assert good["status"] == "completed" and good["request_counts"]["failed"] == 0, good
    texts = {
        line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
        for line in good_output
    }
    assert texts == {f"good-{index}": _expected_text() for index in range(4)}
    # The poisoned batch ends: failed as a whole naming the line, or completed with that line's error.
    if bad["status"] == "failed":
        assert "poison" in json.dumps(bad["errors"]) or any(
            e.get("line") == 1 for e in bad["errors"]["data"]
        ), bad
    else:
        assert bad["status"] == "completed", bad
        assert [line["custom_id"] for line in bad_errors] == ["poison"], bad_errors
