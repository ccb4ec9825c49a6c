"""Per-tenant quotas against a real Redis: stored files (count and bytes) and open streams, 429 past them."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest
from dirty_equals import IsStr
from redis.asyncio import Redis

from gateway.access.auth import Principal
from gateway.access.stream_slots import StreamSlots
from shared import keys
from shared.access import apikeys
from shared.errors import InvalidRequest, QuotaExceeded
from shared.redis_server import free_port
from tests.helpers import bearer, gateway_only, until
from tests.processes import StreamReader, chat_text, parse_sse, serving, spawn_cli

CHAT = "/v1/chat/completions"
QUOTA_ERROR = {"message": IsStr(), "type": "rate_limit_error", "param": None, "code": "quota_exceeded"}


async def upload(client: httpx.AsyncClient, secret: str, size: int) -> httpx.Response:
    files = {"file": ("input.jsonl", b"x" * size, "application/jsonl")}
    return await client.post("/v1/files", files=files, data={"purpose": "batch"}, headers=bearer(secret))


async def test_stored_files_are_capped_per_tenant_by_count_and_by_bytes(redis: Redis, redis_url: str) -> None:
    alice = (await apikeys.create_key(redis, "alice")).secret
    bob = (await apikeys.create_key(redis, "bob")).secret
    async with gateway_only(redis_url, max_files_per_tenant=2, max_file_bytes_per_tenant=100) as client:
        first, second = await upload(client, alice, 40), await upload(client, alice, 40)
        third = await upload(client, alice, 10)
        other_tenant = await upload(client, bob, 40)
        deleted = await client.delete(f"/v1/files/{first.json()['id']}", headers=bearer(alice))
        over_bytes = await upload(client, alice, 61)
        fits = await upload(client, alice, 60)

    assert first.status_code == second.status_code == 200
    assert third.status_code == 429 and third.json()["error"] == QUOTA_ERROR
    assert "2 of 2 files" in third.json()["error"]["message"]
    assert int(third.headers["retry-after"]) >= 1
    assert other_tenant.status_code == 200  # one tenant's full quota costs another nothing
    assert deleted.status_code == 200
    assert over_bytes.status_code == 429 and "40 of 100 bytes" in over_bytes.json()["error"]["message"]
    assert fits.status_code == 200


async def test_a_tenants_file_count_lapses_with_its_files(redis: Redis, redis_url: str) -> None:
    alice = await apikeys.create_key(redis, "alice")
    async with gateway_only(redis_url, max_files_per_tenant=1, result_retention_s=1) as client:
        kept = await upload(client, alice.secret, 10)
        refused = await upload(client, alice.secret, 10)
        usage_ttl = await redis.ttl(keys.files_usage(alice.record.tenant))

        async def fits_again() -> bool:
            return (await upload(client, alice.secret, 10)).status_code == 200

        await until(fits_again)  # the first file expired, and with it its place in the quota

    assert kept.status_code == 200 and refused.status_code == 429
    assert 0 < usage_ttl <= 1  # the usage record is bounded in time like the files it counts


@pytest.fixture
def streaming_stack(redis_url: str, redis: Redis) -> Iterator[tuple[str, str]]:
    """A gateway process allowing 2 streams per tenant, and a fake worker slow enough to keep streams open."""
    model = f"quota-{uuid.uuid4().hex[:8]}"
    port = free_port()
    processes = [
        spawn_cli(
            "worker", "--redis-url", redis_url, "--engine", "fake", "--model", model, "--poll-delay", "0.01",
            env={"TOKENFERRY_FAKE_STEP_DELAY_S": "0.02"},
        ),
        spawn_cli(
            "gateway", "--redis-url", redis_url, "--port", str(port),
            env={"TOKENFERRY_MAX_STREAMS_PER_TENANT": "2", "TOKENFERRY_AUTH_CACHE_S": "0"},
        ),
    ]  # fmt: skip
    with serving(f"http://127.0.0.1:{port}", processes, model, 60) as url:
        yield url, model


@pytest.mark.timeout(120)
async def test_open_streams_are_capped_per_tenant_and_given_back_however_they_end(
    streaming_stack: tuple[str, str], redis: Redis
) -> None:
    url, model = streaming_stack
    alice = await apikeys.create_key(redis, "alice")
    bob = await apikeys.create_key(redis, "bob")
    long = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    long |= {"max_tokens": 300, "ignore_eos": True}
    short = long | {"max_tokens": 5}
    alice_open = keys.open_streams(alice.record.tenant)

    async def alice_has(count: int) -> bool:
        return int(await redis.zcard(alice_open)) == count

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async with client.stream("POST", CHAT, json=long, headers=bearer(alice.secret)) as first:
            first_stream = StreamReader(first)
            await first_stream.until_text(5)
            async with client.stream("POST", CHAT, json=long, headers=bearer(alice.secret)) as second:
                second_stream = StreamReader(second)  # kept: a dropped reader closes its response
                await second_stream.until_text(5)
                refused = await client.post(CHAT, json=short, headers=bearer(alice.secret))
                other_tenant = await client.post(CHAT, json=short, headers=bearer(bob.secret))
            await until(lambda: alice_has(1))  # the second's client left: its slot came back
            again = await client.post(CHAT, json=short, headers=bearer(alice.secret))
            await first_stream.rest()
        await until(lambda: alice_has(0))  # finished streams give theirs back too

    assert refused.status_code == 429 and refused.json()["error"] == QUOTA_ERROR
    assert refused.headers["retry-after"] == "1"
    assert other_tenant.status_code == 200 and parse_sse(other_tenant.text.splitlines())[-1].data == "[DONE]"
    assert again.status_code == 200 and parse_sse(again.text.splitlines())[-1].data == "[DONE]"
    assert first_stream.events[-1].data == "[DONE]" and len(chat_text(first_stream.events)) > 0


async def test_a_crashed_gateways_streams_stop_counting_once_they_lapse(redis: Redis) -> None:
    alice = Principal(key_id="key_alice", tenant="alice")
    slots = StreamSlots(redis, max_streams=1, lifetime_s=0.5)

    async def never_given_back(release: Callable[[], Awaitable[None]]) -> str:
        return "streaming"  # its gateway dies: nothing ever calls release

    async def refused_before_streaming(release: Callable[[], Awaitable[None]]) -> str:
        raise InvalidRequest("the prompt is too long")

    with pytest.raises(InvalidRequest):
        await slots.open(alice, "refused", refused_before_streaming)
    assert await slots.open_count("alice") == 0  # a 4xx before the stream gives its slot back at once
    assert await slots.open(alice, "orphan", never_given_back) == "streaming"
    with pytest.raises(QuotaExceeded):
        await slots.open(alice, "next", never_given_back)
    ttl_ms = await redis.pttl(keys.open_streams("alice"))

    async def a_slot_is_free() -> bool:
        return await slots.open_count("alice") == 0

    await until(a_slot_is_free, timeout_s=5)
    assert await slots.open(alice, "after the lapse", never_given_back) == "streaming"
    assert 0 < ttl_ms <= 1000  # the set itself expires with its last member
