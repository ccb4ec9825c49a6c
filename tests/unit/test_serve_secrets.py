"""``tokenferry serve`` keeps secrets off command lines and out of its banner."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

import cli
from cli import serve as serve_module

PASSWORD = "hunter2-secret"
REDIS_URL = f"redis://:{PASSWORD}@redis.internal:6379/0"
API_KEY = "tf-user-key-secret"
ADMIN_KEY = "tf-admin-key-secret"


class RecordingSupervisor:
    """Stands in for the process supervisor: records what each child would be started with."""

    started: ClassVar[list[tuple[str, list[str], dict[str, str]]]] = []

    def __init__(self, grace_s: float) -> None:
        RecordingSupervisor.started = []

    def start(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> None:
        RecordingSupervisor.started.append((name, list(argv), dict(env or {})))

    def stop(self) -> None:
        pass


def run_serve(monkeypatch: pytest.MonkeyPatch, *argv: str) -> None:
    monkeypatch.setattr(serve_module, "Supervisor", RecordingSupervisor)
    monkeypatch.setattr(serve_module, "require_free_port", lambda *args: None)  # no real port here
    monkeypatch.setattr(serve_module, "stop_on_signals", threading.Event)
    monkeypatch.setattr(serve_module, "_wait_until_ready", lambda *args: "tiny-model")
    monkeypatch.setattr(serve_module, "_wait_for_exit", lambda *args: 0)
    parser, flags = cli._parser()
    assert serve_module.serve(parser.parse_args(["serve", *argv]), flags) == 0


def test_serve_passes_secrets_to_its_children_in_the_environment_and_masks_the_banner(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_serve(
        monkeypatch,
        "--redis-url", REDIS_URL, "--api-key", API_KEY, "--admin-api-key", ADMIN_KEY,
        "--max-body-bytes", "1000",
    )  # fmt: skip

    banner = capsys.readouterr().out
    children: dict[str, Any] = {name: (argv, env) for name, argv, env in RecordingSupervisor.started}
    assert set(children) == {"worker", "gateway"}
    for argv, env in children.values():
        assert not [part for part in argv if PASSWORD in part or "tf-" in part]
        assert env["TOKENFERRY_REDIS_URL"] == REDIS_URL
    gateway_argv, gateway_env = children["gateway"]
    assert "--max-body-bytes" in gateway_argv  # other flags still travel as flags
    assert gateway_env["TOKENFERRY_API_KEYS"] == API_KEY
    assert gateway_env["TOKENFERRY_ADMIN_API_KEYS"] == ADMIN_KEY
    assert "TOKENFERRY_API_KEYS" not in children["worker"][1]  # the worker needs no keys
    assert PASSWORD not in banner
    assert "redis://:***@redis.internal:6379/0" in banner


def test_serve_refuses_a_key_its_children_could_not_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="cannot contain a comma"):
        run_serve(monkeypatch, "--redis-url", REDIS_URL, "--api-key", "one,two")
