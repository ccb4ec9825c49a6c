"""The pure parts of security: key secrets and hashes, the authenticator's rules and cache,
rate-limit rendering, the max_tokens cap and token estimate, Redis URL parsing."""

from __future__ import annotations

import hashlib
from typing import cast

import fakeredis
import pytest
from dirty_equals import IsStr
from redis.asyncio import Redis

from gateway.access.auth import ANONYMOUS, Authenticator, Limits, bearer_secret, find_static, static_keys
from gateway.access.quota import capped, estimated_tokens
from gateway.access.rate_limits import Resource, duration_text, rate_limit_headers, refusal
from shared.access import apikeys
from shared.access.token_buckets import BucketState
from shared.errors import InvalidRequest, RequestRateLimited, TokenRateLimited, Unauthorized
from shared.jobs.jobqueue import redacted_url, redis_settings
from shared.protocol import ChatMessage, ChatPrompt, GenerationJob, SamplingSpec, TextPrompt, TokenPrompt
from shared.settings import GatewaySettings


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_redis() -> Redis:
    return cast(Redis, fakeredis.FakeAsyncRedis())


def test_secrets_carry_256_random_bits_and_ids_are_public_names() -> None:
    secret = apikeys.new_secret()

    assert secret == IsStr(regex=r"tf-[A-Za-z0-9_-]{43}")
    assert apikeys.new_secret() != secret
    assert apikeys.new_key_id() == IsStr(regex=r"key_[0-9a-f]{24}")
    assert apikeys.hint_of(secret) == f"tf-...{secret[-4:]}"


def test_settings_keys_are_hashed_or_taken_as_sha256_entries() -> None:
    digest = hashlib.sha256(b"s3cret").hexdigest()

    assert apikeys.configured_hash("s3cret") == digest
    assert apikeys.configured_hash(f"sha256:{digest.upper()}") == digest
    with pytest.raises(ValueError, match="64 hex digits"):
        apikeys.configured_hash("sha256:abc")
    with pytest.raises(ValueError, match="64 hex digits"):
        GatewaySettings(api_keys=["sha256:not-hex"])


def test_bearer_secret_reads_only_the_bearer_scheme() -> None:
    assert bearer_secret("Bearer tf-abc") == "tf-abc"
    assert bearer_secret("bearer   tf-abc ") == "tf-abc"
    assert bearer_secret("Basic dXNlcjpwYXNz") is None
    assert bearer_secret("Bearer ") is None
    assert bearer_secret(None) is None


def test_static_keys_match_by_hash_and_admin_entries_win() -> None:
    keys = static_keys(["user-key", "both"], ["admin-key", "both"])

    def found(secret: str) -> tuple[bool, str] | None:
        key = find_static(apikeys.hash_secret(secret), keys)
        return None if key is None else (key.is_admin, key.key_id)

    assert found("user-key") == (False, IsStr(regex=r"static_[0-9a-f]{12}"))
    assert found("admin-key") == (True, IsStr(regex=r"static_[0-9a-f]{12}"))
    assert found("both") == (True, IsStr())
    assert found("nope") is None


async def test_without_any_key_every_caller_is_anonymous() -> None:
    auth = Authenticator(fake_redis(), [], Limits(), cache_s=0)

    assert await auth.authenticate(None) == ANONYMOUS
    assert await auth.authenticate("Bearer whatever") == ANONYMOUS
    assert not ANONYMOUS.is_admin


async def test_a_stored_key_authenticates_with_its_own_limits_and_tenant() -> None:
    redis = fake_redis()
    created = await apikeys.create_key(redis, "ci", rpm=5, is_admin=True, tenant="acme")
    auth = Authenticator(redis, [], Limits(rpm=100, tpm=1000), cache_s=0)

    principal = await auth.authenticate(f"Bearer {created.secret}")

    assert (principal.key_id, principal.tenant, principal.is_admin) == (created.record.key_id, "acme", True)
    assert principal.limits == Limits(rpm=5, tpm=1000)  # its own rpm, the default tpm
    with pytest.raises(Unauthorized, match="Incorrect API key"):
        await auth.authenticate("Bearer tf-wrong")
    with pytest.raises(Unauthorized, match="didn't provide an API key"):
        await auth.authenticate(None)


async def test_redis_never_holds_the_secret() -> None:
    redis = fake_redis()
    created = await apikeys.create_key(redis, "ci")

    dumped = [key async for key in redis.scan_iter()]
    values = [await redis.hgetall(key) for key in dumped]  # type: ignore[misc]

    assert created.secret.encode() not in repr((dumped, values)).encode()
    assert created.secret not in repr(created)


async def test_revocation_takes_effect_once_the_cache_expires() -> None:
    redis, clock = fake_redis(), FakeClock()
    created = await apikeys.create_key(redis, "ci")
    auth = Authenticator(redis, [], Limits(), cache_s=2.0, clock=clock)
    header = f"Bearer {created.secret}"
    await auth.authenticate(header)

    await apikeys.revoke_key(redis, created.record.key_id)
    still_cached = await auth.authenticate(header)
    clock.now += 2.0

    assert still_cached.key_id == created.record.key_id
    with pytest.raises(Unauthorized):
        await auth.authenticate(header)


async def test_revoking_the_last_key_keeps_authentication_on() -> None:
    redis = fake_redis()
    created = await apikeys.create_key(redis, "only")
    await apikeys.revoke_key(redis, created.record.key_id)
    auth = Authenticator(redis, [], Limits(), cache_s=0)

    with pytest.raises(Unauthorized):
        await auth.authenticate(None)
    assert [record.is_revoked for record in await apikeys.list_keys(redis)] == [True]


async def test_revoking_an_unknown_key_id_raises_key_not_found() -> None:
    with pytest.raises(apikeys.KeyNotFound):
        await apikeys.revoke_key(fake_redis(), "key_nope")


def test_reset_durations_are_written_like_openai() -> None:
    assert [duration_text(s) for s in (0.0, 0.2504, 1.0, 1.5, 59.9999, 60.0, 360.0, 61.25)] == [
        "0ms",
        "251ms",
        "1s",
        "1.5s",
        "60s",
        "1m0s",
        "6m0s",
        "1m1.25s",
    ]


def test_headers_name_both_resources() -> None:
    states = {
        Resource.REQUESTS: BucketState(limit=60, remaining=59, reset_s=1.0, retry_after_s=None),
        Resource.TOKENS: BucketState(limit=1000, remaining=900, reset_s=6.0, retry_after_s=None),
    }

    assert rate_limit_headers(states) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "6s",
    }


def test_refusals_are_openai_429s_with_whole_second_retry_after() -> None:
    short = BucketState(limit=3, remaining=0, reset_s=60.0, retry_after_s=19.2)
    too_big = BucketState(limit=100, remaining=100, reset_s=0.0, retry_after_s=float("inf"))

    requests = refusal(Resource.REQUESTS, short, 1)
    tokens = refusal(Resource.TOKENS, too_big, 500)

    assert isinstance(requests, RequestRateLimited)
    assert (requests.status, requests.type, requests.code) == (429, "requests", "rate_limit_exceeded")
    assert requests.retry_after_s == 20
    assert requests.message == IsStr(regex=r"Rate limit reached on requests per min \(RPM\).*19\.2s\.")
    assert isinstance(tokens, TokenRateLimited)
    assert tokens.type == "tokens"
    assert tokens.message == "Request too large: tokens per min (TPM) limit 100, requested 500."


def job(max_tokens: int | None, prompt: TextPrompt | TokenPrompt | ChatPrompt | None = None) -> GenerationJob:
    return GenerationJob(
        request_id="r",
        model="m",
        prompt=prompt or TextPrompt(text="12345678"),
        sampling=SamplingSpec(max_tokens=max_tokens),
        created_at=0.0,
    )


def test_max_tokens_over_the_limit_is_400_and_a_missing_one_gets_the_limit() -> None:
    with pytest.raises(InvalidRequest, match="at most 16") as refused:
        capped(job(17), 16)

    assert refused.value.param == "max_tokens"
    assert capped(job(16), 16) == job(16)
    assert capped(job(None), 16).sampling.max_tokens == 16
    assert capped(job(None), None) == job(None)


def test_token_estimate_is_prompt_plus_max_tokens() -> None:
    chat = ChatPrompt(messages=[ChatMessage(role="user", content="x" * 9)])

    assert estimated_tokens(job(10)) == 2 + 10  # 8 characters, 4 per token
    assert estimated_tokens(job(None, TokenPrompt(token_ids=[1, 2, 3]))) == 3
    assert estimated_tokens(job(5, chat)) == 3 + 4 + 5  # 9 characters, a message's template, max_tokens
    assert estimated_tokens(job(10).model_copy(update={"n": 3})) == 2 + 3 * 10  # max_tokens per choice


def test_redis_urls_carry_password_and_tls_into_arq_settings() -> None:
    settings = redis_settings("rediss://app:p%40ss@cache.internal:6380/2?ssl_cert_reqs=none")

    assert (settings.host, settings.port, settings.database) == ("cache.internal", 6380, 2)
    assert (settings.username, settings.password) == ("app", "p@ss")
    assert (settings.ssl, settings.ssl_cert_reqs) == (True, "none")
    assert redis_settings("redis://:pw@h/0").password == "pw"
    assert not redis_settings("redis://h/0").ssl


def test_messages_show_redis_urls_without_the_password() -> None:
    assert redacted_url("rediss://app:p%40ss@cache:6380/2") == "rediss://app:***@cache:6380/2"
    assert redacted_url("redis://h:6379/0") == "redis://h:6379/0"


def test_trust_remote_code_and_cors_are_off_by_default() -> None:
    from shared.settings import WorkerSettings

    assert WorkerSettings().trust_remote_code is False
    assert GatewaySettings().cors_allow_origins == []


def test_debug_logging_announces_that_it_logs_user_data(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from shared.logs import configure_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging("DEBUG")
        configure_logging("INFO")
    finally:
        root.handlers[:], root.level = saved[0], saved[1]

    warnings = [line for line in capsys.readouterr().err.splitlines() if "DEBUG logging is on" in line]
    assert len(warnings) == 1
    assert "prompts and generated text" in warnings[0]


class _RunsCodeWhenUnpickled:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, ("import builtins; builtins.tokenferry_unpickled = True",))


def test_job_payloads_are_never_unpickled() -> None:
    import builtins
    import pickle

    from shared.codec import CodecError, deserialize_arq_job
    from shared.settings import WorkerSettings
    from worker.main import build_worker

    payload = pickle.dumps({"f": "generate", "a": [_RunsCodeWhenUnpickled()]})

    with pytest.raises((CodecError, ValueError)):
        deserialize_arq_job(payload)
    assert not hasattr(builtins, "tokenferry_unpickled")
    worker = build_worker(WorkerSettings(engine="fake", model="m"), handle_signals=False)
    assert worker.job_deserializer is deserialize_arq_job
