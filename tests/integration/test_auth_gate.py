"""Who may call, against a real Redis: the key before the body, the docs behind the key, an admin's powers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from dirty_equals import IsStr
from redis.asyncio import Redis

from shared.access import apikeys
from tests.helpers import bearer, gateway_only

KEY = "user-secret"
ADMIN = "admin-secret"
CHUNK = b"x" * (1024 * 1024)
UPLOAD_CHUNKS = 55  # the 55 MB upload of the review


class CountedBody:
    """A streamed request body that records how much of it the server pulled."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.sent += len(CHUNK)
            yield CHUNK


async def upload(client: httpx.AsyncClient, body: CountedBody, headers: dict[str, str]) -> httpx.Response:
    multipart = {"content-type": "multipart/form-data; boundary=tf-boundary"}
    return await client.post("/v1/files", content=body, headers=multipart | headers)


async def test_an_upload_without_a_valid_key_is_refused_before_its_body_is_read(
    redis: Redis, redis_url: str
) -> None:
    anonymous, wrong, keyed = (CountedBody(UPLOAD_CHUNKS) for _ in range(3))
    async with gateway_only(redis_url, api_keys=[KEY], max_file_bytes=1024 * 1024) as client:
        no_key = await upload(client, anonymous, {})
        bad_key = await upload(client, wrong, bearer("tf-not-a-key"))
        too_large = await upload(client, keyed, bearer(KEY))

    for refused in (no_key, bad_key):
        assert refused.status_code == 401
        assert refused.json() == {
            "error": {
                "message": IsStr(), "type": "invalid_request_error", "param": None, "code": "invalid_api_key",
            }
        }  # fmt: skip
        assert refused.headers["x-request-id"]
    assert anonymous.sent == wrong.sent == 0  # not one byte of the 55 MB was read
    # The same body with a valid key is read, up to the upload limit: the count is a real measure.
    assert too_large.status_code == 413
    assert 0 < keyed.sent < UPLOAD_CHUNKS * len(CHUNK)


async def test_every_guarded_route_refuses_before_reading_its_body_in_its_own_error_shape(
    redis: Redis, redis_url: str
) -> None:
    paths = ("/v1/chat/completions", "/generate", "/admin/keys", "/nowhere")
    bodies = {path: CountedBody(4) for path in paths}
    async with gateway_only(redis_url, api_keys=[KEY]) as client:
        answers = {
            path: await client.post(path, content=body, headers={"content-type": "application/json"})
            for path, body in bodies.items()
        }

    assert {path: answer.status_code for path, answer in answers.items()} == dict.fromkeys(bodies, 401)
    assert all(body.sent == 0 for body in bodies.values())
    assert answers["/v1/chat/completions"].json()["error"]["code"] == "invalid_api_key"
    assert answers["/generate"].json() == {"error": IsStr(), "error_type": "validation"}  # TGI's shape


async def test_open_routes_stay_open_and_a_keyed_caller_is_authenticated_once(
    redis: Redis, redis_url: str
) -> None:
    async with gateway_only(redis_url, api_keys=[KEY]) as client:
        open_routes = {path: await client.get(path) for path in ("/health", "/version", "/metrics")}
        ready = await client.get("/ready")
        keyed = await client.get("/v1/models", headers=bearer(KEY))

    assert {path: answer.status_code for path, answer in open_routes.items()} == dict.fromkeys(
        open_routes, 200
    )
    assert ready.status_code == 503  # no worker here; what matters is that no key was asked for
    assert ready.json()["error"]["code"] == "no_live_worker"
    assert keyed.status_code == 200


async def test_the_api_docs_need_a_key_unless_a_setting_opens_them(redis: Redis, redis_url: str) -> None:
    docs = ("/openapi.json", "/docs", "/redoc")
    async with gateway_only(redis_url, api_keys=[KEY]) as client:
        closed = {path: (await client.get(path)).status_code for path in docs}
        keyed = {path: (await client.get(path, headers=bearer(KEY))).status_code for path in docs}
    async with gateway_only(redis_url, api_keys=[KEY], docs_require_key=False) as client:
        opened = {path: (await client.get(path)).status_code for path in docs}
        api_still_closed = await client.get("/v1/models")

    assert closed == dict.fromkeys(docs, 401)
    assert keyed == opened == dict.fromkeys(docs, 200)
    assert api_still_closed.status_code == 401


async def test_an_admin_creates_keys_only_in_its_own_tenant_or_a_new_one(
    redis: Redis, redis_url: str
) -> None:
    alice = await apikeys.create_key(redis, "alice")
    admin = await apikeys.create_key(redis, "ops", is_admin=True)
    async with gateway_only(redis_url) as client:
        inside_alice = await client.post(
            "/admin/keys", json={"name": "spy", "tenant": alice.record.tenant}, headers=bearer(admin.secret)
        )
        own_tenant = await client.post(
            "/admin/keys", json={"name": "ops 2", "tenant": admin.record.tenant}, headers=bearer(admin.secret)
        )
        new_tenant = await client.post("/admin/keys", json={"name": "bot"}, headers=bearer(admin.secret))

    assert inside_alice.status_code == 403
    assert inside_alice.json()["error"] == {
        "message": IsStr(regex=r".*own tenant.*"), "type": "invalid_request_error",
        "param": "tenant", "code": "insufficient_permissions",
    }  # fmt: skip
    assert [key.name for key in await apikeys.list_keys(redis)] == ["alice", "ops", "ops 2", "bot"]
    assert own_tenant.status_code == 201 and own_tenant.json()["tenant"] == admin.record.tenant
    assert new_tenant.status_code == 201 and new_tenant.json()["tenant"] == new_tenant.json()["id"]
