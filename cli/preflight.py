"""Owns the checks a server command makes before it starts anything: the port is free, Redis answers.

Each failure is one line naming what to fix (``SystemExit`` with the message: exit
code 1, no traceback), instead of a success banner followed by ``Errno 98``, or
uvicorn's lifespan traceback. The checks are a first look, not a lock: a port
taken between the check and the bind still fails, only less politely.
"""

from __future__ import annotations

import errno
import socket

from redis.exceptions import RedisError

from shared.redis_connect import sync_client
from shared.redis_url import redacted_url

WORKER_REDIS_TIMEOUT_S = 5.0  # the worker has no Redis timeout setting; the gateway's defaults to 2 s


def require_free_port(command: str, host: str, port: int) -> None:
    """Exit with one line unless ``host:port`` can be listened on (as uvicorn will, SO_REUSEADDR)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            # As uvicorn binds: a port left in TIME_WAIT by a previous run is free, a listening one is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except socket.gaierror as error:
        raise SystemExit(f"tokenferry {command}: cannot resolve --host {host}: {error.strerror}") from None
    except OSError as error:
        raise SystemExit(port_problem(command, host, port, error)) from None


def port_problem(command: str, host: str, port: int, error: OSError) -> str:
    """The line saying why ``host:port`` cannot be listened on."""
    if error.errno == errno.EADDRINUSE:
        return (
            f"tokenferry {command}: port {port} on {host} is already in use by another process; "
            f"stop it or choose another port with --port"
        )
    if error.errno == errno.EACCES:
        return f"tokenferry {command}: no permission to listen on port {port}; choose a port above 1023"
    return f"tokenferry {command}: cannot listen on {host}:{port}: {error.strerror or error}"


def require_redis(command: str, url: str, timeout_s: float) -> None:
    """Exit with one line unless the Redis at ``url`` answers a PING within ``timeout_s``."""
    try:
        client = sync_client(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    except ValueError as error:  # not a redis:// (rediss://, unix://) URL
        raise SystemExit(f"tokenferry {command}: bad Redis URL {redacted_url(url)}: {error}") from None
    try:
        client.ping()
    except RedisError as error:
        raise SystemExit(redis_problem(command, url, error)) from None
    finally:
        client.close()


def redis_problem(command: str, url: str, error: Exception) -> str:
    """The line saying Redis at ``url`` (password masked) cannot be used, and what to do."""
    reason = str(error).strip().rstrip(".")
    return (
        f"tokenferry {command}: cannot reach Redis at {redacted_url(url)}: {reason}; "
        f"start Redis there or pass --redis-url (TOKENFERRY_REDIS_URL)"
    )
