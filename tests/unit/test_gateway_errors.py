"""Every failure answers OpenAI's error envelope with OpenAI's status, and always an x-request-id."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import fakeredis
import httpx
import pytest
from arq.connections import ArqRedis
from dirty_equals import IsStr
from fastapi import FastAPI
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.groups import GroupPools
from gateway.http.app import build_state, create_app
from gateway.http.errors import error_response, to_domain_error, unknown_model
from shared.errors import ContextLengthExceeded, Overloaded, TokenferryError, error_from_info
from shared.settings import GatewaySettings

CHAT = "/v1/chat/completions"
VALID_CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


def error(
    message: Any, type_: str = "invalid_request_error", param: Any = None, code: Any = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def build_app(**settings: Any) -> FastAPI:
    """The real app with a stand-in state: these requests fail before anything touches Redis."""
    app = create_app(GatewaySettings(**settings))
    groups = GroupPools.single(cast(ArqRedis, fakeredis.FakeAsyncRedis()))
    app.state.gateway = build_state(GatewaySettings(**settings), groups, Dispatcher(groups, timeout_s=1.0))
    return app


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client


async def test_validation_error_is_400_naming_the_parameter(client: httpx.AsyncClient) -> None:
    response = await client.post(CHAT, json={**VALID_CHAT, "temperature": 3})

    assert response.status_code == 400
    assert response.json() == error(IsStr(regex=r"Invalid 'temperature': .*2.*"), param="temperature")
    assert response.headers["x-request-id"] == IsStr(regex=r"[0-9a-f]{32}")


async def test_nested_validation_error_param_is_the_dotted_location(client: httpx.AsyncClient) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}

    response = await client.post(CHAT, json=body)

    assert response.status_code == 400
    assert response.json() == error(IsStr(regex=r".*Invalid role 'robot'.*"), param="messages.1.role")


async def test_missing_field_says_which(client: httpx.AsyncClient) -> None:
    response = await client.post(CHAT, json={"model": "m"})

    assert response.json() == error("Missing required parameter: 'messages'.", param="messages")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"store": True}, "store"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
        ({"prompt_cache_options": {"mode": "explicit"}}, "prompt_cache_options.mode"),
        ({"verbosity": "low"}, "verbosity"),
        ({"skip_special_tokens": False}, "skip_special_tokens"),
        ({"include_stop_str_in_output": True}, "include_stop_str_in_output"),
        ({"continue_final_message": True}, "continue_final_message"),
    ],
)
async def test_unsupported_features_are_400_not_silently_dropped(
    client: httpx.AsyncClient, fields: dict[str, Any], param: str
) -> None:
    response = await client.post(CHAT, json={**VALID_CHAT, **fields})

    assert response.status_code == 400
    refused = IsStr(regex=r".*(not supported|not available|Only |must be).*")
    assert response.json() == error(refused, param=param)


@pytest.mark.parametrize("field", ["guided_whitespace_pattern", "documents", "no_such_field"])
async def test_unknown_fields_are_400_naming_them_as_openai_does(
    client: httpx.AsyncClient, field: str
) -> None:
    response = await client.post(CHAT, json={**VALID_CHAT, field: 1})

    assert response.status_code == 400
    assert response.json() == error(f"Unrecognized request argument supplied: {field}.", param=field)


async def test_a_bad_prompt_in_a_list_is_refused_with_a_clear_message(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"model": "m", "prompt": ["a", [1, "b"]]})

    assert response.status_code == 400
    assert response.json() == error(
        "Invalid 'prompt': The prompt must be a string, a list of strings, a list of token ids or a list "
        "of token-id lists.",
        param="prompt",
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", IsStr(regex=r"The request body is not valid JSON .*")),
        (b"[1, 2]", "The request body must be a JSON object."),
        (b"", "The request body is empty; send a JSON object."),
    ],
)
async def test_body_that_is_not_a_json_object_is_400(
    client: httpx.AsyncClient, content: bytes, message: Any
) -> None:
    response = await client.post(CHAT, content=content, headers={"content-type": "application/json"})

    assert response.status_code == 400
    assert response.json() == error(message)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
async def test_body_not_declared_as_json_is_415(client: httpx.AsyncClient, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}

    response = await client.post(CHAT, content=b'{"model": "m"}', headers=headers)

    assert response.status_code == 415
    assert response.json() == error(
        IsStr(regex=r"Content-Type must be application/json.*"),
        param="content-type",
        code="unsupported_media_type",
    )


async def test_unknown_route_is_404_in_openai_shape(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/embeddings", json={})

    assert response.status_code == 404
    assert response.json() == error("Invalid URL (POST /v1/embeddings)")
    assert "x-request-id" in response.headers


async def test_wrong_method_is_405_in_openai_shape(client: httpx.AsyncClient) -> None:
    response = await client.get(CHAT)

    assert response.status_code == 405
    assert response.json() == error("Method GET is not allowed for /v1/chat/completions.")
    assert response.headers["allow"] == "POST"


async def test_each_request_gets_its_own_id(client: httpx.AsyncClient) -> None:
    first = await client.get("/health")
    second = await client.get("/health", headers={"x-request-id": "client-chosen"})

    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert second.headers["x-request-id"] != "client-chosen"  # ids are job ids: never the client's


async def test_body_over_the_limit_by_content_length_is_413() -> None:
    transport = httpx.ASGITransport(app=build_app(max_body_bytes=100))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        response = await client.post(CHAT, json={**VALID_CHAT, "user": "x" * 200})

    assert response.status_code == 413
    assert response.json() == error(IsStr(regex=r".*limit of 100 bytes.*"), code="payload_too_large")
    assert "x-request-id" in response.headers


async def test_streamed_body_over_the_limit_is_413_by_counting() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 50  # no Content-Length: the body arrives chunked

    transport = httpx.ASGITransport(app=build_app(max_body_bytes=100))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        response = await client.post(CHAT, content=chunks(), headers={"content-type": "application/json"})

    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


async def test_api_keys_guard_every_route_but_health() -> None:
    transport = httpx.ASGITransport(app=build_app(api_keys=["k1", "k2"]))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        missing = await client.get("/v1/models")
        wrong = await client.post(CHAT, json=VALID_CHAT, headers={"authorization": "Bearer nope"})
        health = await client.get("/health")
        right = await client.post(CHAT, json={"model": "m"}, headers={"authorization": "Bearer k2"})

    no_key = error(IsStr(regex=r"You didn't provide an API key\..*Bearer.*"), code="invalid_api_key")
    assert (missing.status_code, missing.json()) == (401, no_key)
    incorrect = error("Incorrect API key provided.", code="invalid_api_key")
    assert (wrong.status_code, wrong.json()) == (401, incorrect)
    assert health.status_code == 200
    assert right.status_code == 400  # past the guard, stopped by validation


async def test_unexpected_exception_is_500_in_openai_shape_with_request_id() -> None:
    app = build_app()

    async def explode() -> None:
        raise RuntimeError("bug")

    app.add_api_route("/explode", explode)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        response = await client.get("/explode")

    assert response.status_code == 500
    assert response.json() == error(
        "The server had an error while processing your request.", type_="server_error"
    )
    assert "x-request-id" in response.headers


def test_overloaded_is_429_with_retry_after() -> None:
    response = error_response(Overloaded("Too busy.", retry_after_s=3), request_id="abc")

    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.headers["x-request-id"] == "abc"


def test_redis_unreachable_is_503_service_unavailable() -> None:
    converted = to_domain_error(RedisConnectionError("refused"))

    assert (converted.status, converted.code) == (503, "service_unavailable")


def test_worker_reported_errors_come_back_as_their_own_class() -> None:
    info = ContextLengthExceeded("Prompt has 9000 tokens; the limit is 2048.", param="messages").to_info()

    rebuilt = to_domain_error(error_from_info(info))

    assert isinstance(rebuilt, ContextLengthExceeded)
    assert (rebuilt.status, rebuilt.code, rebuilt.param) == (400, "context_length_exceeded", "messages")


def test_unknown_exception_becomes_a_generic_server_error() -> None:
    converted = to_domain_error(KeyError("x"))

    assert type(converted) is TokenferryError
    assert converted.status == 500


def test_an_unknown_model_names_the_served_models_so_a_typo_shows() -> None:
    assert unknown_model("smolm2", ["b", "a", "b"]).message == (
        "The model `smolm2` does not exist or is not served here. Served models: a, b."
    )
    assert unknown_model("x", []).message == (
        "The model `x` does not exist or is not served here. No model is served here right now."
    )
    many = unknown_model("x", [f"m{index:02}" for index in range(25)]).message
    assert many.endswith("m18, m19 and 5 more.")
