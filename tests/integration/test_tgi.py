"""TGI's native routes through the real gateway app, a real Redis and a fake-engine worker.

The huggingface_hub client is exercised over real HTTP in test_client_conformance;
these pin what that client does not show: the compatibility route's list, TGI's
error shape and statuses, and model resolution when several models are live.
"""

from __future__ import annotations

import time

from dirty_equals import IsStr
from redis.asyncio import Redis

from shared import registry
from shared.redis_server import EmbeddedRedis
from shared.registry import WorkerInfo
from shared.settings import WorkerSettings
from tests.helpers import FAKE_MODEL, parse_sse, running_stack

SCRIPT = WorkerSettings.model_fields["fake_script"].default


async def test_compat_route_answers_a_list_or_a_stream(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        plain = await client.post("/", json={"inputs": "Once", "parameters": {"max_new_tokens": 3}})
        streamed = await client.post(
            "/", json={"inputs": "Once", "parameters": {"max_new_tokens": 3}, "stream": True}
        )

    assert (plain.status_code, plain.json()) == (200, [{"generated_text": SCRIPT[:3]}])
    events = parse_sse(streamed.text)
    assert [event["token"]["text"] for event in events] == list(SCRIPT[:3])
    assert events[-1]["generated_text"] == SCRIPT[:3]
    assert "[DONE]" not in streamed.text  # TGI's own client parses every data line as JSON


async def test_return_full_text_prepends_the_inputs(redis: Redis, redis_url: str) -> None:
    body = {"inputs": "Once", "parameters": {"max_new_tokens": 3, "return_full_text": True}}
    async with running_stack(redis_url) as client:
        response = await client.post("/generate", json=body)

    assert response.json() == {"generated_text": "Once" + SCRIPT[:3]}


async def test_info_describes_the_served_model(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, max_model_len=512) as client:
        response = await client.get("/info")

    assert response.status_code == 200
    assert response.json() | {"version": "v"} == {
        "model_id": FAKE_MODEL,
        "model_sha": None,
        "model_pipeline_tag": "text-generation",
        "max_best_of": 1,
        "max_stop_sequences": 4,
        "max_input_tokens": 511,
        "max_total_tokens": 512,
        "max_client_batch_size": 1,
        "router": "tokenferry",
        "version": "v",
        "sha": None,
        "docker_label": None,
    }


async def test_errors_on_tgi_routes_have_tgi_shape_and_status(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, max_model_len=64) as client:
        invalid = await client.post("/generate", json={"inputs": "x", "parameters": {"top_p": 1.0}})
        too_long = await client.post("/generate_stream", json={"inputs": "x" * 100})
        not_json = await client.post("/generate", content=b"{", headers={"content-type": "application/json"})
        wrong_type = await client.post("/generate", content=b"{}", headers={"content-type": "text/plain"})
        unsupported = await client.post("/generate", json={"inputs": "x", "parameters": {"truncate": 5}})

    assert [(r.status_code, r.json()) for r in (invalid, too_long, not_json, wrong_type, unsupported)] == [
        (
            422,
            {
                "error": IsStr(regex=r"Invalid 'parameters.top_p': .*less than 1.*"),
                "error_type": "validation",
            },
        ),
        (422, {"error": IsStr(regex=r".*maximum context length is 64 tokens.*"), "error_type": "validation"}),
        (422, {"error": IsStr(regex=r"The request body is not valid JSON.*"), "error_type": "validation"}),
        (415, {"error": IsStr(regex=r"Content-Type must be application/json.*"), "error_type": "validation"}),
        (
            422,
            {
                "error": "Invalid 'parameters.truncate': truncate is not supported.",
                "error_type": "validation",
            },
        ),
    ]


async def test_several_live_models_need_the_model_named() -> None:
    other = WorkerInfo(worker_id="other", model="other-model", max_model_len=128, started_at=time.time())
    # A Redis of its own, so the live models are exactly this test's two.
    with EmbeddedRedis() as private_redis:
        redis = Redis.from_url(private_redis.url)
        try:
            await _ask_ambiguously(private_redis.url, redis, other)
        finally:
            await redis.aclose()


async def _ask_ambiguously(redis_url: str, redis: Redis, other: WorkerInfo) -> None:
    async with running_stack(redis_url) as client:
        await registry.heartbeat(redis, other)
        ambiguous = await client.post("/generate", json={"inputs": "x"})
        named = await client.post("/generate", json={"inputs": "x", "model": FAKE_MODEL, "parameters": {}})
        info = await client.get("/info", params={"model": "other-model"})

    assert (ambiguous.status_code, ambiguous.json()["error"]) == (
        422,
        "This server serves several models (fake-model, other-model); name one with `model`.",
    )
    assert named.json() == {"generated_text": SCRIPT}
    assert (info.json()["model_id"], info.json()["max_total_tokens"]) == ("other-model", 128)
