"""Owns the forms of ``--redis-url``: which are accepted, and the Sentinel form parsed once.

Two forms:

- **direct**: ``redis://``, ``rediss://`` and ``unix://``, read by redis-py's own
  ``parse_url`` where a client is built (``shared/redis_connect.py``), exactly as before
  Sentinel support existed;
- **Sentinel**: ``redis+sentinel://[[user]:password@]host1[:port1][,host2[:port2]...]/service_name[/db]``,
  the form Celery/kombu and others use. The hosts are Sentinels (port 26379 when left
  out); ``service_name`` is the name the Sentinels monitor (``sentinel monitor <name> ...``).

The user and password are the **data nodes'** (the primary and its replicas), never
the Sentinels': the Sentinels are reached without a password (arq, which the worker's
queue uses, cannot pass the Sentinels one). Intentional divergence: ``rediss+sentinel``
(TLS) is refused with a clear error rather than half-supported, since TLS to the
Sentinels and to the data nodes would need separate options.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

SETTING = "--redis-url (TOKENFERRY_REDIS_URL)"
SENTINEL_SCHEME = "redis+sentinel"
DIRECT_PREFIXES = ("redis://", "rediss://", "unix://")
SENTINEL_PORT = 26379


class RedisUrlError(ValueError):
    """The Redis URL is not one of the accepted forms; the message names the setting."""


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """Where a ``redis+sentinel://`` URL points: the Sentinels and the service they monitor."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` is in the Sentinel form (of any validity)."""
    return url.lower().startswith(f"{SENTINEL_SCHEME}://")


def check_redis_url(url: str) -> str:
    """``url`` unchanged if it is an accepted form, else ``RedisUrlError`` saying what is wrong."""
    if is_sentinel_url(url):
        parse_sentinel_url(url)
    elif not url.startswith(DIRECT_PREFIXES):
        raise RedisUrlError(
            f"{SETTING} must start with redis://, rediss://, unix:// or {SENTINEL_SCHEME}://"
            f" (got {redacted_url(url)!r})"
        )
    return url


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The Sentinels, service, database and data-node credentials of a ``redis+sentinel://`` URL."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() != SENTINEL_SCHEME:
        raise _bad(url, f"the scheme must be {SENTINEL_SCHEME}://")
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0].split("#", 1)[0]
    userinfo, _, hosts = netloc.rpartition("@")
    username, password = _credentials(userinfo)
    service_name, db = _service_and_db(url, path)
    return SentinelTarget(
        sentinels=tuple(_sentinel_address(url, host) for host in hosts.split(",")),
        service_name=service_name,
        db=db,
        username=username,
        password=password,
    )


def redacted_url(url: str) -> str:
    """``url`` with its password masked, for messages and logs (either form)."""
    if is_sentinel_url(url):
        scheme, _, rest = url.partition("://")
        netloc, slash, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        if ":" not in userinfo:
            return url
        return f"{scheme}://{userinfo.split(':', 1)[0]}:***{at}{hosts}{slash}{path}"
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    user, has_password, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if has_password else None)


def _service_and_db(url: str, path: str) -> tuple[str, int]:
    parts = [part for part in path.split("/") if part]
    if not parts or len(parts) > 2:
        raise _bad(url, "give the monitored service's name as the path: .../service_name[/db]")
    if len(parts) == 1:
        return unquote(parts[0]), 0
    if not parts[1].isdigit():
        raise _bad(url, f"the database after the service name must be a number, not {parts[1]!r}")
    return unquote(parts[0]), int(parts[1])


def _sentinel_address(url: str, address: str) -> tuple[str, int]:
    if address.startswith("["):  # [IPv6]:port
        host, _, port = address[1:].partition("]")
        port = port.removeprefix(":")
    elif address.count(":") > 1:
        raise _bad(url, f"write an IPv6 Sentinel in brackets: [{address}]:{SENTINEL_PORT}")
    else:
        host, _, port = address.partition(":")
    if not host:
        raise _bad(url, "give at least one Sentinel as host:port, several separated by commas")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise _bad(url, f"the Sentinel port {port!r} is not a port number")
    return host, int(port) if port else SENTINEL_PORT


def _bad(url: str, why: str) -> RedisUrlError:
    return RedisUrlError(f"{SETTING}: bad Sentinel URL {redacted_url(url)!r}: {why}")
