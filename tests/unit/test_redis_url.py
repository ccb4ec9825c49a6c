"""The forms of ``--redis-url``: the Sentinel form parsed, the direct forms read as before, bad ones named."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.redis_connect import arq_settings, async_client
from shared.redis_url import RedisUrlError, SentinelTarget, check_redis_url, parse_sentinel_url, redacted_url
from shared.settings import GatewaySettings


def test_a_sentinel_url_names_every_sentinel_the_service_db_and_the_data_nodes_credentials() -> None:
    url = "redis+sentinel://app:p%40ss@s1:26380,10.0.0.2,[::1]:26381/cache/3"
    assert parse_sentinel_url(url) == SentinelTarget(
        sentinels=(("s1", 26380), ("10.0.0.2", 26379), ("::1", 26381)),
        service_name="cache",
        db=3,
        username="app",
        password="p@ss",
    )


def test_a_sentinel_url_without_credentials_or_db_uses_db_0() -> None:
    assert parse_sentinel_url("redis+sentinel://s1:26379/mymaster") == SentinelTarget(
        sentinels=(("s1", 26379),), service_name="mymaster"
    )
    assert parse_sentinel_url("redis+sentinel://:pw@s1/mymaster/").password == "pw"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://s1:26379", "service's name"),
        ("redis+sentinel://s1:26379/", "service's name"),
        ("redis+sentinel://s1:26379/a/b/c", "service's name"),
        ("redis+sentinel://s1:26379/mymaster/x", "must be a number"),
        ("redis+sentinel://s1:port/mymaster", "not a port number"),
        ("redis+sentinel://s1:99999/mymaster", "not a port number"),
        ("redis+sentinel://:pw@/mymaster", "at least one Sentinel"),
        ("redis+sentinel://s1,,s2/mymaster", "at least one Sentinel"),
        ("redis+sentinel://::1:26379/mymaster", "IPv6"),
    ],
)
def test_a_bad_sentinel_url_says_why_and_names_the_setting(url: str, why: str) -> None:
    with pytest.raises(RedisUrlError, match=why) as raised:
        check_redis_url(url)
    assert "--redis-url (TOKENFERRY_REDIS_URL)" in str(raised.value)


def test_the_password_is_masked_in_the_error() -> None:
    with pytest.raises(RedisUrlError) as raised:
        check_redis_url("redis+sentinel://:secret@s1:26379")
    assert "secret" not in str(raised.value)
    assert redacted_url("redis+sentinel://u:secret@s1,s2/m") == "redis+sentinel://u:***@s1,s2/m"
    assert redacted_url("redis+sentinel://s1/m") == "redis+sentinel://s1/m"


@pytest.mark.parametrize("url", ["redis://h/0", "rediss://:pw@h:6380/2", "unix:///tmp/r.sock?db=1"])
def test_direct_urls_are_accepted_unchanged(url: str) -> None:
    assert check_redis_url(url) == url


@pytest.mark.parametrize("url", ["http://h:6379", "rediss+sentinel://s1/m", "h:6379"])
def test_other_schemes_are_refused_naming_the_accepted_forms(url: str) -> None:
    with pytest.raises(RedisUrlError, match=r"redis\+sentinel://"):
        check_redis_url(url)


def test_settings_refuse_a_bad_sentinel_url_at_start_up() -> None:
    with pytest.raises(ValidationError, match="service's name"):
        GatewaySettings(redis_url="redis+sentinel://s1:26379")


def test_arq_gets_the_sentinels_and_the_service() -> None:
    settings = arq_settings("redis+sentinel://:pw@s1:26380,s2/cache/2")
    assert (settings.host, settings.sentinel, settings.sentinel_master) == (
        [("s1", 26380), ("s2", 26379)],
        True,
        "cache",
    )
    assert (settings.database, settings.password, settings.conn_retries) == (2, "pw", 0)


def test_arq_reads_a_direct_url_as_before() -> None:
    settings = arq_settings("rediss://app:p%40ss@cache.internal:6380/2?ssl_cert_reqs=none")
    assert (settings.host, settings.port, settings.database, settings.password, settings.ssl) == (
        "cache.internal",
        6380,
        2,
        "p@ss",
        True,
    )
    assert not settings.sentinel


async def test_a_sentinel_client_asks_the_sentinels_for_the_primary_and_keeps_timeouts() -> None:
    client = async_client("redis+sentinel://:pw@s1:26380/cache/1", socket_connect_timeout=2)
    pool = client.connection_pool
    assert pool.service_name == "cache"  # type: ignore[attr-defined]
    assert (pool.connection_kwargs["password"], pool.connection_kwargs["db"]) == ("pw", 1)
    sentinel = pool.sentinel_manager.sentinels[0]  # type: ignore[attr-defined]
    assert sentinel.connection_pool.connection_kwargs["port"] == 26380
    assert sentinel.connection_pool.connection_kwargs.get("password") is None
    assert sentinel.connection_pool.connection_kwargs["socket_connect_timeout"] == 2
    await client.aclose()
