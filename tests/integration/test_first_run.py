"""A newcomer's first mistakes: each CLI error is one line and a non-zero exit, a misspelt model a useful 404.

Port taken, no Redis, a model that never becomes ready, an empty API key, a
misspelt model: what a user of vLLM or TGI trips over in the first hour. The CLI
cases run real processes; the 404s run the in-process stack.
"""

from __future__ import annotations

import json
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.redis_connect import sync_client
from shared.redis_server import free_port
from shared.settings import WorkerSettings
from tests.helpers import FAKE_MODEL, chat_body, running_stack
from tests.processes import read_until_serving, run_cli, serving, spawn_cli

SCRIPT = WorkerSettings.model_fields["fake_script"].default
MISSPELT = f"The model `fake-modle` does not exist or is not served here. Served models: {FAKE_MODEL}."
START_TIMEOUT_S = 60.0


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another (plain socket) server listens on."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.fixture
def keyless_stack(redis_url: str) -> Iterator[str]:
    """A gateway without API keys and a fake-engine worker, as processes; the OpenAI base URL."""
    port = free_port()
    processes = [
        spawn_cli("worker", "--redis-url", redis_url, "--engine", "fake", "--model", FAKE_MODEL),
        spawn_cli("gateway", "--redis-url", redis_url, "--port", str(port)),
    ]
    with serving(f"http://127.0.0.1:{port}", processes, FAKE_MODEL, START_TIMEOUT_S) as base_url:
        yield f"{base_url}/v1"


def one_line(stderr: str) -> str:
    """The single line a first-run error prints, asserting there is exactly one and no traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_serve_on_a_taken_port_says_so_in_one_line_before_starting_anything(taken_port: int) -> None:
    result = run_cli("serve", "--port", str(taken_port), "--engine", "fake", "--model", FAKE_MODEL)

    assert result.returncode != 0
    assert f"port {taken_port} on 127.0.0.1 is already in use" in one_line(result.stderr)
    assert "tokenferry is serving" not in result.stdout


def test_a_gateway_on_a_taken_port_says_so_in_one_line(taken_port: int, redis_url: str) -> None:
    result = run_cli("gateway", "--redis-url", redis_url, "--port", str(taken_port))

    assert result.returncode != 0
    assert f"port {taken_port} on 127.0.0.1 is already in use" in one_line(result.stderr)


def test_a_gateway_without_redis_names_the_url_in_one_line_with_the_password_masked() -> None:
    closed = free_port()
    result = run_cli(
        "gateway", "--port", str(free_port()), "--redis-url", f"redis://:hunter2@127.0.0.1:{closed}"
    )

    assert result.returncode != 0
    line = one_line(result.stderr)
    assert line.startswith(f"tokenferry gateway: cannot reach Redis at redis://:***@127.0.0.1:{closed}")
    assert "hunter2" not in result.stderr + result.stdout


def test_serve_stops_with_one_clear_line_when_the_model_is_not_ready_in_time() -> None:
    port = str(free_port())
    slow_load = {"TOKENFERRY_FAKE_LOAD_DELAY_S": "600"}  # stands in for a long download
    argv = ("serve", "--port", port, "--engine", "fake", "--model", FAKE_MODEL, "--ready-timeout", "2")
    result = run_cli(*argv, env=slow_load)

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert f"tokenferry serve: loading model {FAKE_MODEL}..." in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"tokenferry serve: {FAKE_MODEL} was not served within 2 s; stopping. "
        "A first start may still be downloading it: raise --ready-timeout, or 0 for no limit"
    )
    assert "tokenferry is serving" not in result.stdout


def test_serve_with_an_api_key_announces_itself_once_its_model_is_served() -> None:
    """Readiness is read from /version and /ready, which need no key: /v1/models would answer 401."""
    port = free_port()
    argv = ("serve", "--port", str(port), "--engine", "fake", "--model", FAKE_MODEL, "--api-key", "k1")
    serve = spawn_cli(*argv)
    try:
        output = read_until_serving(serve)
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=30)
    assert f"tokenferry is serving {FAKE_MODEL} at http://127.0.0.1:{port}/v1" in output
    assert serve.returncode == 0


def test_serve_connects_its_gateway_and_worker_to_the_private_redis_over_its_unix_socket() -> None:
    """The banner names the TCP address (for redis-cli); the children use the socket (no TCP stack)."""
    port = free_port()
    serve = spawn_cli("serve", "--port", str(port), "--engine", "fake", "--model", FAKE_MODEL)
    try:
        output = read_until_serving(serve)
        banner_url = re.search(r"private Redis at (redis://\S+);", output)
        assert banner_url is not None, output
        with sync_client(banner_url.group(1)) as redis:
            clients = redis.client_list()
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=30)
    others = [client for client in clients if client["cmd"] != "client|list"]
    assert others, clients  # the worker's and the gateway's connections
    assert all("redis.sock" in client["addr"] for client in others), others


def test_an_empty_api_key_means_no_key_for_complete_and_batch(keyless_stack: str, tmp_path: Path) -> None:
    empty_env = {"TOKENFERRY_API_KEY": "", "TOKENFERRY_BASE_URL": keyless_stack}
    completed = run_cli("complete", "Hi", "--max-tokens", "3", env=empty_env)
    flagged = run_cli("complete", "Hi", "--max-tokens", "3", "--api-key", "", "--base-url", keyless_stack)
    requests = tmp_path / "requests.jsonl"
    body = chat_body(max_tokens=3)
    line = {"custom_id": "one", "method": "POST", "url": "/v1/chat/completions", "body": body}
    requests.write_text(json.dumps(line) + "\n")
    batch = run_cli("batch", "submit", str(requests), "--wait", "--poll", "0.2", env=empty_env)

    assert (completed.returncode, completed.stdout.strip()) == (0, SCRIPT[:3]), completed.stderr
    assert (flagged.returncode, flagged.stdout.strip()) == (0, SCRIPT[:3]), flagged.stderr
    assert batch.returncode == 0, batch.stderr
    output = json.loads((tmp_path / "requests.output.jsonl").read_text())
    assert output["custom_id"] == "one"
    assert output["response"]["body"]["choices"][0]["message"]["content"] == SCRIPT[:3]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chat/completions", chat_body(model="fake-modle")),
        ("POST", "/v1/completions", {"model": "fake-modle", "prompt": "Hi"}),
        ("GET", "/v1/models/fake-modle", None),
    ],
)
async def test_a_misspelt_model_is_404_listing_the_served_models(
    redis_url: str, method: str, path: str, body: dict[str, object] | None
) -> None:
    async with running_stack(redis_url) as client:
        response = await client.request(method, path, json=body)

    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": MISSPELT,
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


async def test_a_misspelt_model_on_tgi_routes_lists_the_served_models(redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        generated = await client.post("/generate", json={"inputs": "Hi", "model": "fake-modle"})
        info = await client.get("/info", params={"model": "fake-modle"})

    assert generated.status_code == 404
    assert generated.json()["error"] == MISSPELT
    assert info.status_code == 404
    assert info.json()["error"] == MISSPELT
