"""Owns building Redis connections from ``--redis-url``: every client, pool and arq setting.

Every process reaches Redis through here, so a URL form is supported everywhere or
nowhere. A direct URL (``redis://``, ``rediss://``, ``unix://``) is read by redis-py's
``from_url``/``parse_url`` exactly as before. A ``redis+sentinel://`` URL
(``shared/redis_url.py``) gives clients over redis-py's ``SentinelConnectionPool``:
each new connection asks a Sentinel for the current primary, and a connection to a
primary that has been demoted is dropped (redis-py turns its ``READONLY`` reply into a
``ConnectionError``), so after a failover the next reconnect reaches the promoted
replica. To our code a failover is therefore a short Redis outage, which it already
rides out (the stream readers' ``outage_tolerance_s``, the leases, arq's retries).
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.sentinel
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.connection import SSLConnection, parse_url

from shared.jobs.arq_seam import RedisSettings
from shared.redis_url import SentinelTarget, is_sentinel_url, parse_sentinel_url

# TLS options a rediss:// URL may carry as query parameters, named as both libraries name them.
_TLS_OPTIONS = {"ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_check_hostname"}


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """A Sentinel-managed pool that waits for a free connection instead of opening more."""


def async_client(url: str, **options: Any) -> Redis:
    """An async client for ``url``; ``options`` are redis-py connection options (timeouts, name)."""
    if not is_sentinel_url(url):
        return cast(Redis, Redis.from_url(url, **options))
    target = parse_sentinel_url(url)
    return cast(Redis, _sentinel(target, options).master_for(target.service_name))


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client for ``url``, for the CLI's one-shot checks."""
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **options)
    target = parse_sentinel_url(url)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        target.sentinels, sentinel_kwargs=_socket_options(options), **_data_node_options(target), **options
    )
    return cast(redis.Redis, sentinel.master_for(target.service_name))  # type: ignore[no-untyped-call]


def blocking_pool(
    url: str, *, max_connections: int, timeout: float | None, **options: Any
) -> BlockingConnectionPool:
    """A pool of at most ``max_connections`` that waits ``timeout`` for one to come free."""
    if not is_sentinel_url(url):
        return BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout, **options
        )
    target = parse_sentinel_url(url)
    sentinel = _sentinel(target, options)
    return _sentinel_pool(
        target.service_name, sentinel, max_connections, timeout, **sentinel.connection_kwargs
    )


def dedicated_client(template: Redis, client_name: str) -> Redis:
    """A client over one connection of its own, reaching Redis as ``template`` does."""
    pool = template.connection_pool
    options = {**pool.connection_kwargs, "client_name": client_name}
    if isinstance(pool, SentinelConnectionPool):
        options.pop("connection_pool")  # the Sentinel pool points its connections at itself
        dedicated = _sentinel_pool(pool.service_name, pool.sentinel_manager, 1, None, **options)
    else:
        dedicated = BlockingConnectionPool(
            connection_class=pool.connection_class, max_connections=1, timeout=None, **options
        )
    return Redis(connection_pool=dedicated)


def arq_settings(url: str) -> RedisSettings:
    """arq's connection settings for ``url``, read as ``async_client`` reads it.

    arq's own ``from_dsn`` leaves a percent-encoded password encoded and drops TLS
    query options; redis-py's parser handles both (``rediss://:p%40ss@host/0?ssl_cert_reqs=none``).
    """
    settings = (
        _arq_sentinel_settings(parse_sentinel_url(url)) if is_sentinel_url(url) else _arq_direct_settings(url)
    )
    # Fail fast instead of arq's default of retrying the connection for seconds.
    settings.conn_timeout = 2
    settings.conn_retries = 0
    return settings


def _arq_direct_settings(url: str) -> RedisSettings:
    parsed: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    settings = RedisSettings(
        host=parsed.get("host", "localhost"),
        port=parsed.get("port", 6379),
        unix_socket_path=parsed.get("path"),
        database=parsed.get("db", 0),
        username=parsed.get("username"),
        password=parsed.get("password"),
        ssl=parsed.get("connection_class") is SSLConnection,
    )
    for option in _TLS_OPTIONS & parsed.keys():
        setattr(settings, option, parsed[option])
    return settings


def _arq_sentinel_settings(target: SentinelTarget) -> RedisSettings:
    return RedisSettings(
        host=list(target.sentinels),
        sentinel=True,
        sentinel_master=target.service_name,
        database=target.db,
        username=target.username,
        password=target.password,
    )


def _sentinel_pool(
    service_name: str, sentinel: Sentinel, max_connections: int, timeout: float | None, **options: Any
) -> BlockingConnectionPool:
    return _BlockingSentinelPool(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        service_name, sentinel, max_connections=max_connections, timeout=timeout, is_master=True, **options
    )


def _sentinel(target: SentinelTarget, options: dict[str, Any]) -> Sentinel:
    # The Sentinels get the socket timeouts but not the data nodes' credentials (see redis_url).
    return Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        target.sentinels, sentinel_kwargs=_socket_options(options), **_data_node_options(target), **options
    )


def _socket_options(options: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in options.items() if name.startswith("socket_")}


def _data_node_options(target: SentinelTarget) -> dict[str, Any]:
    return {"db": target.db, "username": target.username, "password": target.password}
