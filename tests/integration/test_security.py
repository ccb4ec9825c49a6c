"""Security against a real Redis and the fake engine: keys, admin rights, rate limits, tenants, CORS, logs."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import pytest
from dirty_equals import IsInt, IsStr
from fastapi import Depends
from redis.asyncio import Redis

from cli import main as cli_main
from gateway.access.ownership import owned
from gateway.http.app import create_app
from gateway.http.deps import guard_request
from shared.access import apikeys, ownership
from shared.access.ownership import ResourceKind
from shared.settings import GatewaySettings
from tests.helpers import FAKE_MODEL, chat_body, running_stack

ADMIN = "admin-secret"
MODELS = "/v1/models"
CHAT = "/v1/chat/completions"


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def error_of(response: httpx.Response) -> tuple[int, str, str | None]:
    body = response.json()["error"]
    return response.status_code, body["type"], body["code"]


@contextlib.asynccontextmanager
async def gateway_only(redis_url: str, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The real app and lifespan, no worker: for what is decided before any job exists."""
    app = create_app(GatewaySettings(redis_url=redis_url, **settings))

    async def show_request(
        request_id: Annotated[str, Depends(owned(ResourceKind.REQUEST, "request_id"))],
    ) -> str:
        return request_id

    # Stands in for the stream-resume endpoint: a route serving a request id to its owner only.
    app.add_api_route("/test/requests/{request_id}", show_request, dependencies=[Depends(guard_request)])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=10) as client:
            yield client


async def test_keys_in_redis_turn_auth_on_and_only_live_keys_pass(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, gateway={"auth_cache_s": 0}) as client:
        open_before = await client.get(MODELS)
        created = await apikeys.create_key(redis, "ci")
        missing = await client.get(MODELS)
        wrong = await client.get(MODELS, headers=bearer("tf-not-a-key"))
        right = await client.post(CHAT, json=chat_body(max_tokens=3), headers=bearer(created.secret))
        await apikeys.revoke_key(redis, created.record.key_id)
        revoked = await client.get(MODELS, headers=bearer(created.secret))
        health = await client.get("/health")

    assert open_before.status_code == 200
    for refused in (missing, wrong, revoked):
        assert error_of(refused) == (401, "invalid_request_error", "invalid_api_key")
    assert right.status_code == 200
    assert right.json()["choices"][0]["message"]["content"] == IsStr(min_length=1)
    assert health.status_code == 200


async def test_revocation_reaches_a_caching_gateway_within_its_cache_time(
    redis: Redis, redis_url: str
) -> None:
    created = await apikeys.create_key(redis, "ci")
    async with gateway_only(redis_url, auth_cache_s=0.5) as client:
        assert (await client.get(MODELS, headers=bearer(created.secret))).status_code == 200
        await apikeys.revoke_key(redis, created.record.key_id)
        revoked_at = time.monotonic()
        async with asyncio.timeout(5):
            while True:  # an external condition (a cache expiring): polled, with a deadline
                if (await client.get(MODELS, headers=bearer(created.secret))).status_code == 401:
                    break
                await asyncio.sleep(0.05)

    assert time.monotonic() - revoked_at < 1.5


async def test_settings_accept_a_key_as_its_sha256(redis: Redis, redis_url: str) -> None:
    digest = hashlib.sha256(b"s3cret").hexdigest()
    async with gateway_only(redis_url, api_keys=[f"sha256:{digest}"]) as client:
        by_secret = await client.get(MODELS, headers=bearer("s3cret"))
        by_hash = await client.get(MODELS, headers=bearer(f"sha256:{digest}"))

    assert by_secret.status_code == 200
    assert by_hash.status_code == 401


async def test_admin_endpoints_need_an_admin_key(redis: Redis, redis_url: str) -> None:
    user = await apikeys.create_key(redis, "user")
    async with gateway_only(redis_url, admin_api_keys=[ADMIN], auth_cache_s=0) as client:
        as_user = await client.get("/admin/keys", headers=bearer(user.secret))
        anonymous = await client.get("/admin/keys")
        made = await client.post("/admin/keys", json={"name": "bot", "rpm": 7}, headers=bearer(ADMIN))
        listed = await client.get("/admin/keys", headers=bearer(ADMIN))
        new_secret = made.json()["secret"]
        new_works = await client.get(MODELS, headers=bearer(new_secret))
        unknown = await client.delete("/admin/keys/key_000000000000000000000000", headers=bearer(ADMIN))
        revoked = await client.delete(f"/admin/keys/{made.json()['id']}", headers=bearer(ADMIN))
        new_refused = await client.get(MODELS, headers=bearer(new_secret))

    assert error_of(as_user) == (403, "invalid_request_error", "insufficient_permissions")
    assert error_of(anonymous) == (401, "invalid_request_error", "invalid_api_key")
    assert made.status_code == 201
    assert made.json() == {
        "object": "api_key", "id": IsStr(regex=r"key_\w+"), "name": "bot", "tenant": made.json()["id"],
        "hint": f"tf-...{new_secret[-4:]}", "rpm": 7, "tpm": None, "is_admin": False,
        "created_at": IsInt(gt=0), "is_revoked": False, "secret": IsStr(regex=r"tf-.{43}"),
    }  # fmt: skip
    assert [key["name"] for key in listed.json()["data"]] == ["user", "bot"]
    assert new_secret not in listed.text and apikeys.hash_secret(new_secret) not in listed.text
    assert new_works.status_code == 200
    assert error_of(unknown) == (404, "invalid_request_error", "not_found")
    assert revoked.json()["is_revoked"] is True
    assert new_refused.status_code == 401


async def test_requests_per_minute_answer_429_with_openai_headers(redis: Redis, redis_url: str) -> None:
    created = await apikeys.create_key(redis, "slow", rpm=2, tpm=1000)
    async with gateway_only(redis_url, auth_cache_s=0) as client:
        first, second, third = [await client.get(MODELS, headers=bearer(created.secret)) for _ in range(3)]

    assert first.status_code == second.status_code == 200
    assert {name: first.headers[name] for name in first.headers if name.startswith("x-ratelimit")} == {
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": IsStr(regex=r"\d+(\.\d+)?s|\d+ms"),
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "1000",
        "x-ratelimit-reset-tokens": "0ms",
    }
    assert error_of(third) == (429, "requests", "rate_limit_exceeded")
    assert third.json()["error"]["message"] == IsStr(regex=r"Rate limit reached on requests per min.*")
    assert 20 <= int(third.headers["retry-after"]) <= 30  # one request refills in 30 s at 2 per minute
    assert third.headers["x-ratelimit-remaining-requests"] == "0"


async def test_tokens_per_minute_count_the_prompt_and_max_tokens(redis: Redis, redis_url: str) -> None:
    created = await apikeys.create_key(redis, "tokens", tpm=60)
    headers = bearer(created.secret)
    async with running_stack(redis_url, gateway={"admin_api_keys": [ADMIN], "auth_cache_s": 0}) as client:
        first = await client.post(CHAT, json=chat_body("Hi", max_tokens=40), headers=headers)
        second = await client.post(CHAT, json=chat_body("Hi", max_tokens=40), headers=headers)
        too_big = await client.post(CHAT, json=chat_body("Hi", max_tokens=100), headers=headers)

    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining-tokens"] == "15"  # 60 - (1 + 4 template + 40)
    assert error_of(second) == (429, "tokens", "rate_limit_exceeded")
    assert int(second.headers["retry-after"]) >= 1
    assert error_of(too_big) == (429, "tokens", "rate_limit_exceeded")
    assert too_big.json()["error"]["message"] == IsStr(regex=r"Request too large.*limit 60, requested 105\.")


async def test_callers_without_limits_get_no_rate_limit_headers(redis: Redis, redis_url: str) -> None:
    async with gateway_only(redis_url) as client:
        response = await client.get(MODELS)

    assert not [name for name in response.headers if name.startswith("x-ratelimit")]


async def test_max_tokens_limit_refuses_more_and_caps_open_requests(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, gateway={"max_tokens_limit": 8}) as client:
        over = await client.post(CHAT, json=chat_body(max_tokens=9))
        open_ended = await client.post(CHAT, json=chat_body(ignore_eos=True))

    assert error_of(over) == (400, "invalid_request_error", None)
    assert over.json()["error"]["param"] == "max_tokens"
    assert open_ended.json()["usage"]["completion_tokens"] == 8
    assert open_ended.json()["choices"][0]["finish_reason"] == "length"


async def test_tgi_generation_routes_pass_the_same_quota_charge(redis: Redis, redis_url: str) -> None:
    created = await apikeys.create_key(redis, "tgi", tpm=20)
    gateway = {"admin_api_keys": [ADMIN], "auth_cache_s": 0, "max_tokens_limit": 8}
    async with running_stack(redis_url, gateway=gateway) as client:
        over_cap = await client.post(
            "/generate",
            json={"inputs": "Hi", "parameters": {"max_new_tokens": 9}},
            headers=bearer(created.secret),
        )
        allowed = await client.post(
            "/generate",
            json={"inputs": "Hi", "parameters": {"max_new_tokens": 8}},
            headers=bearer(created.secret),
        )
        streamed = await client.post(
            "/generate_stream",
            json={"inputs": "Hi", "parameters": {"max_new_tokens": 8}},
            headers=bearer(created.secret),
        )
        limited = await client.post(
            "/generate",
            json={"inputs": "Hi", "parameters": {"max_new_tokens": 8}},
            headers=bearer(created.secret),
        )

    assert over_cap.status_code == 422  # TGI's status for invalid parameters
    assert over_cap.json() == {
        "error": IsStr(regex=r"max_tokens is too large: 9.*at most 8\."),
        "error_type": "validation",
    }
    assert allowed.status_code == streamed.status_code == 200
    assert allowed.headers["x-ratelimit-remaining-tokens"] == "11"  # 20 - (1 prompt + 8)
    assert streamed.headers["x-ratelimit-remaining-tokens"] == "2"  # streamed answers carry them too
    assert limited.status_code == 429 and "retry-after" in limited.headers


async def test_a_request_belongs_to_the_tenant_that_made_it(redis: Redis, redis_url: str) -> None:
    alice = await apikeys.create_key(redis, "alice")
    async with running_stack(redis_url, gateway={"admin_api_keys": [ADMIN], "auth_cache_s": 0}) as client:
        response = await client.post(CHAT, json=chat_body(max_tokens=2), headers=bearer(alice.secret))

    request_id = response.headers["x-request-id"]
    assert await ownership.owner_of(redis, ResourceKind.REQUEST, request_id) == alice.record.tenant


async def test_another_tenants_id_is_404_exactly_like_an_unknown_id(redis: Redis, redis_url: str) -> None:
    alice = await apikeys.create_key(redis, "alice")
    alice_again = await apikeys.create_key(redis, "alice rotated", tenant=alice.record.tenant)
    bob = await apikeys.create_key(redis, "bob", is_admin=True)
    request_id = "0" * 32
    await ownership.record_owner(redis, ResourceKind.REQUEST, request_id, alice.record.tenant, ttl_s=60)
    async with gateway_only(redis_url, auth_cache_s=0) as client:
        own = await client.get(f"/test/requests/{request_id}", headers=bearer(alice.secret))
        same_tenant = await client.get(f"/test/requests/{request_id}", headers=bearer(alice_again.secret))
        other = await client.get(f"/test/requests/{request_id}", headers=bearer(bob.secret))
        missing = await client.get(f"/test/requests/{'1' * 32}", headers=bearer(bob.secret))

    assert own.json() == same_tenant.json() == request_id
    assert error_of(other) == error_of(missing) == (404, "invalid_request_error", "not_found")
    assert other.json()["error"]["message"] == f"No request found with id '{request_id}'."


async def test_cors_is_off_by_default_and_allows_only_configured_origins(
    redis: Redis, redis_url: str
) -> None:
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST"}
    async with gateway_only(redis_url) as client:
        off = await client.options(CHAT, headers=preflight)
    async with gateway_only(redis_url, cors_allow_origins=["https://app.example"], api_keys=["k"]) as client:
        on = await client.options(
            CHAT, headers=preflight | {"access-control-request-headers": "authorization"}
        )
        other = await client.options(CHAT, headers=preflight | {"origin": "https://evil.example"})
        refused = await client.get(MODELS, headers={"origin": "https://app.example"})

    assert "access-control-allow-origin" not in off.headers
    assert on.status_code == 200
    assert on.headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-origin" not in other.headers
    # An error answer still carries CORS headers, so the browser app can read the 401.
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == "https://app.example"


async def test_info_logs_never_hold_prompts_outputs_or_keys(
    redis: Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    user = await apikeys.create_key(redis, "user")
    prompt = "my very private prompt"
    async with running_stack(redis_url, gateway={"admin_api_keys": [ADMIN], "auth_cache_s": 0}) as client:
        plain = await client.post(CHAT, json=chat_body(prompt, max_tokens=5), headers=bearer(user.secret))
        streamed = await client.post(
            CHAT, json=chat_body(prompt, max_tokens=5, stream=True), headers=bearer(user.secret)
        )

    output = plain.json()["choices"][0]["message"]["content"]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert streamed.status_code == 200 and output
    assert "accepted" in logged  # the lifecycle lines were captured
    for secret in (prompt, output, user.secret, ADMIN, apikeys.hash_secret(user.secret)):
        assert secret not in logged


def run_cli(*argv: str) -> int:
    try:
        cli_main(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


async def test_keys_cli_creates_lists_and_revokes_against_redis(
    redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The CLI runs its own event loop, so it runs in a thread here.
    code = await asyncio.to_thread(
        run_cli, "keys", "create", "--name", "ci bot", "--rpm", "5", "--redis-url", redis_url
    )
    created = capsys.readouterr().out
    secret = created.split()[-1]
    key_id = (await apikeys.list_keys(redis))[0].key_id
    await asyncio.to_thread(run_cli, "keys", "list", "--redis-url", redis_url)
    listed = capsys.readouterr().out
    async with gateway_only(redis_url, auth_cache_s=0) as client:
        before = await client.get(MODELS, headers=bearer(secret))
        revoke_code = await asyncio.to_thread(run_cli, "keys", "revoke", key_id, "--redis-url", redis_url)
        after = await client.get(MODELS, headers=bearer(secret))
    unknown_code = await asyncio.to_thread(run_cli, "keys", "revoke", "key_nope", "--redis-url", redis_url)

    assert code == revoke_code == 0
    assert unknown_code == 1
    assert secret == IsStr(regex=r"tf-.{43}") and key_id in created
    assert key_id in listed and "ci bot" in listed and f"tf-...{secret[-4:]}" in listed
    assert secret not in listed and apikeys.hash_secret(secret) not in listed
    assert before.status_code == 200 and before.headers["x-ratelimit-limit-requests"] == "5"
    assert after.status_code == 401
    assert "revoked" in capsys.readouterr().out.lower()


async def test_models_endpoint_lists_the_fake_model_to_a_keyed_caller(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, gateway={"api_keys": ["k"]}) as client:
        response = await client.get(MODELS, headers=bearer("k"))

    assert [model["id"] for model in response.json()["data"]] == [FAKE_MODEL]
