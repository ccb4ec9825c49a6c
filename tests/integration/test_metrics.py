"""Prometheus metrics of a real stack (gateway app, real Redis, fake-engine worker), scraped and parsed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
from redis.asyncio import Redis

from gateway.http.app import create_app
from gateway.ops.queue_depth import QUEUE_DEPTH_LEASE_S
from shared import keys, registry
from shared.redis_server import free_port
from shared.settings import GatewaySettings
from tests.helpers import FAKE_MODEL, chat_body, gateway_only, parse_sse, running_stack, until_running
from tests.scrape import Scrape

# ASCII only: one token per delta, so the token timings are countable exactly.
SCRIPT = "Metrics, measured. "
PROMPT_TOKENS = len(b"user: Hi\nassistant:")
CHAT = "/v1/chat/completions"
SUCCESS = "tokenferry_worker_request_success_total"
QUEUE_DEPTH = "tokenferry_queue_depth"


async def _scrape_worker(port: int) -> Scrape:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    return Scrape.parse(response.text)


async def _two_chats(client: httpx.AsyncClient) -> None:
    plain = await client.post(CHAT, json=chat_body())
    streamed = await client.post(CHAT, json=chat_body(stream=True))
    assert plain.status_code == streamed.status_code == 200
    assert plain.json()["choices"][0]["message"]["content"] == SCRIPT
    assert parse_sse(streamed.text)[-1] == "[DONE]"


async def test_gateway_metrics_count_requests_and_time_their_tokens(redis_url: str, redis: Redis) -> None:
    async with running_stack(redis_url, fake_script=SCRIPT) as client:
        await _two_chats(client)
        unknown = await client.post(CHAT, json=chat_body(model="nobody-serves-this"))
        assert unknown.status_code == 404
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    scrape = Scrape.parse(response.text)
    requests = "tokenferry_gateway_requests_total"
    assert scrape.type_of("tokenferry_gateway_requests") == "counter"
    assert scrape.value(requests, endpoint=CHAT, model=FAKE_MODEL, status="200") == 2
    assert scrape.value(requests, endpoint=CHAT, model="", status="404") == 1  # the bogus name is no label
    assert scrape.value("tokenferry_gateway_time_to_first_token_seconds_count", model=FAKE_MODEL) == 2
    assert scrape.value("tokenferry_gateway_e2e_request_latency_seconds_count", model=FAKE_MODEL) == 2
    itl_count = scrape.value("tokenferry_gateway_inter_token_latency_seconds_count", model=FAKE_MODEL)
    assert itl_count == 2 * (len(SCRIPT) - 1)
    assert scrape.value("tokenferry_gateway_open_streams", model=FAKE_MODEL) == 0
    assert scrape.value("tokenferry_queue_depth", model=FAKE_MODEL, lane="interactive") == 0
    assert scrape.value("tokenferry_queue_depth", model=FAKE_MODEL, lane="batch") == 0


async def test_queue_depth_is_read_from_redis_at_scrape_time(redis_url: str, redis: Redis) -> None:
    async with running_stack(redis_url) as client:
        # A model served before whose workers are gone, with jobs waiting for it.
        await redis.hset(keys.known_models(), "idle-model", str(time.time()))  # type: ignore[misc]
        await redis.zadd(keys.queue("idle-model", keys.Lane.BATCH), {"job-1": 1, "job-2": 2})
        scrape = Scrape.parse((await client.get("/metrics")).text)
        assert scrape.value("tokenferry_queue_depth", model="idle-model", lane="batch") == 2
        assert scrape.value("tokenferry_queue_depth", model="idle-model", lane="interactive") == 0
        await redis.delete(keys.queue("idle-model", keys.Lane.BATCH))
        scrape = Scrape.parse((await client.get("/metrics")).text)
        assert scrape.value("tokenferry_queue_depth", model="idle-model", lane="batch") == 0


async def test_worker_metrics_port_counts_tokens_steps_and_queue_wait(redis_url: str, redis: Redis) -> None:
    port = free_port()
    async with running_stack(redis_url, fake_script=SCRIPT, metrics_port=port) as client:
        await _two_chats(client)
        scrape = await _scrape_worker(port)
    generated = len(SCRIPT) + 1  # the fake emits its script, then EOS
    assert scrape.value("tokenferry_worker_generation_tokens_total") == 2 * generated
    assert scrape.value("tokenferry_worker_prompt_tokens_total") == 2 * PROMPT_TOKENS
    assert scrape.value("tokenferry_worker_queue_wait_seconds_count") == 2
    assert scrape.value("tokenferry_worker_step_duration_seconds_count") >= generated
    # Between a running request's steps the loop routes and publishes: one gap per step but its first.
    assert scrape.value("tokenferry_worker_step_gap_seconds_count") >= generated - 1
    # Every step that produced tokens had them routed and published.
    assert scrape.value("tokenferry_worker_route_duration_seconds_count") >= generated
    assert scrape.value("tokenferry_worker_publish_duration_seconds_count") >= generated
    assert scrape.value("tokenferry_worker_batch_size_sum") == 2 * generated
    assert scrape.value("tokenferry_worker_running_sequences") == 0
    assert scrape.value("tokenferry_worker_waiting_sequences") == 0
    assert scrape.value("tokenferry_worker_failovers_total") == 0
    assert scrape.type_of("tokenferry_worker_kv_cache_usage_ratio") == "gauge"


async def test_worker_counts_each_request_by_finish_reason_and_its_lengths(
    redis_url: str, redis: Redis
) -> None:
    port = free_port()
    async with running_stack(
        redis_url, fake_script=SCRIPT * 20, fake_step_delay_s=0.01, metrics_port=port
    ) as client:
        stopped = await client.post(CHAT, json=chat_body(stop=["measured"]))
        cut = await client.post(CHAT, json=chat_body(max_tokens=3))
        assert stopped.json()["choices"][0]["finish_reason"] == "stop"
        assert cut.json()["choices"][0]["finish_reason"] == "length"
        # A client that gives up while its request generates: the gateway aborts the job.
        leaving = asyncio.create_task(client.post(CHAT, json=chat_body()))
        await until_running(redis, 1)
        leaving.cancel()
        scrape = await _wait_for_scrape(
            port, lambda scrape: scrape.value(SUCCESS, finished_reason="abort") == 1
        )
    reasons = {
        reason: scrape.value(SUCCESS, finished_reason=reason)
        for reason in ("stop", "length", "abort", "error")
    }
    assert reasons == {"stop": 1, "length": 1, "abort": 1, "error": 0}
    generated = stopped.json()["usage"]["completion_tokens"] + cut.json()["usage"]["completion_tokens"]
    assert scrape.value("tokenferry_worker_request_generation_tokens_count") == 2  # the aborted one is not
    assert scrape.value("tokenferry_worker_request_generation_tokens_sum") == generated
    assert scrape.value("tokenferry_worker_request_prompt_tokens_sum") == 2 * PROMPT_TOKENS
    assert scrape.value("tokenferry_worker_request_prompt_tokens_bucket", le="20.0") == 2
    samples = [sample for _type, family in scrape.families.values() for sample in family]
    assert {sample.labels.get("model_name") for sample in samples} == {FAKE_MODEL}


async def _wait_for_scrape(port: int, is_wanted: Callable[[Scrape], bool], timeout_s: float = 10.0) -> Scrape:
    """The worker's first scrape that ``is_wanted`` (an abort reaches the worker at its next poll)."""
    async with asyncio.timeout(timeout_s):
        while True:
            scrape = await _scrape_worker(port)
            if is_wanted(scrape):
                return scrape
            await asyncio.sleep(0.05)


async def test_one_gateway_of_several_exports_the_queue_depth(redis_url: str, redis: Redis) -> None:
    await redis.hset(keys.known_models(), "idle-model", str(time.time()))  # type: ignore[misc]
    await redis.zadd(keys.queue("idle-model", keys.Lane.BATCH), {"job-1": 1, "job-2": 2})
    async with running_stack(redis_url) as first, gateway_only(redis_url) as second:
        scrapes = [Scrape.parse((await gateway.get("/metrics")).text) for gateway in (first, second)]
        exporting = [scrape.labels_of(QUEUE_DEPTH) != [] for scrape in scrapes]
        assert exporting == [True, False]  # the first one scraped took the lease and keeps it
        assert sum(scrape.value(QUEUE_DEPTH, model="idle-model", lane="batch") for scrape in scrapes) == 2
        assert Scrape.parse((await second.get("/metrics")).text).labels_of(QUEUE_DEPTH) == []
        # A dead holder's lease lapses by itself.
        assert 0 < await redis.pttl(keys.queue_depth_lease()) <= QUEUE_DEPTH_LEASE_S * 1000
        await redis.delete(keys.queue_depth_lease())  # the holder died: its lease lapsed
        taken_over = Scrape.parse((await second.get("/metrics")).text)
        assert taken_over.value(QUEUE_DEPTH, model="idle-model", lane="batch") == 2
        assert Scrape.parse((await first.get("/metrics")).text).labels_of(QUEUE_DEPTH) == []


async def test_a_gateway_that_stops_gives_the_queue_depth_lease_back(redis_url: str, redis: Redis) -> None:
    await redis.hset(keys.known_models(), "idle-model", str(time.time()))  # type: ignore[misc]
    await redis.zadd(keys.queue("idle-model", keys.Lane.BATCH), {"job-1": 1})
    async with gateway_only(redis_url) as second:
        async with gateway_only(redis_url) as first:
            assert Scrape.parse((await first.get("/metrics")).text).labels_of(QUEUE_DEPTH) != []
            assert Scrape.parse((await second.get("/metrics")).text).labels_of(QUEUE_DEPTH) == []
        assert await redis.exists(keys.queue_depth_lease()) == 0  # the first stopped: no 90 s gap
        taken_over = Scrape.parse((await second.get("/metrics")).text)
        assert taken_over.value(QUEUE_DEPTH, model="idle-model", lane="batch") == 1


async def test_the_heartbeat_publishes_the_worker_load(redis_url: str, redis: Redis) -> None:
    # Two ~2 s generations, heartbeats every 0.5 s: some land while both run, some after.
    overrides = {"fake_script": SCRIPT * 20, "fake_step_delay_s": 0.005, "heartbeat_interval_s": 0.5}
    async with running_stack(redis_url, **overrides) as client:
        chats = asyncio.gather(*(client.post(CHAT, json=chat_body()) for _ in range(2)))
        busy = await _wait_for_load(
            redis, lambda load: load.running == 2 and load.generation_tokens_per_s > 0
        )
        assert [response.status_code for response in await chats] == [200, 200]
        idle = await _wait_for_load(redis, lambda load: load.generation_tokens_per_s == 0)
    assert busy.waiting == 0
    assert (idle.running, idle.waiting) == (0, 0)


async def _wait_for_load(
    redis: Redis, is_wanted: Callable[[registry.WorkerLoad], bool], timeout_s: float = 10.0
) -> registry.WorkerLoad:
    """The first load a heartbeat publishes that ``is_wanted``."""
    async with asyncio.timeout(timeout_s):
        while True:
            # Other tests' workers (the e2e session's real-model worker) may share this Redis.
            (worker,) = [info for info in await registry.live_workers(redis) if info.model == FAKE_MODEL]
            if worker.load is not None and is_wanted(worker.load):
                assert worker.heartbeat_at is not None and time.time() - worker.heartbeat_at < 5
                return worker.load
            await asyncio.sleep(0.05)


async def test_metrics_are_open_unless_configured_to_need_a_key_and_stay_out_of_openapi(
    redis_url: str, redis: Redis
) -> None:
    for require_key, status_without_key in ((False, 200), (True, 401)):
        settings = GatewaySettings(redis_url=redis_url, api_keys=["sk-test"], metrics_require_key=require_key)
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                assert (await client.get("/metrics")).status_code == status_without_key
                keyed = await client.get("/metrics", headers={"Authorization": "Bearer sk-test"})
                assert keyed.status_code == 200
                schema = await client.get("/openapi.json", headers={"Authorization": "Bearer sk-test"})
                assert "/metrics" not in schema.json()["paths"]
