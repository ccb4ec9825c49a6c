"""Owns ``tokenferry serve``: supervises Redis, one gateway and one worker; Ctrl-C stops them all.

The children are the same ``tokenferry gateway`` / ``tokenferry worker`` processes
production runs, so the all-in-one mode exercises the real topology. If any child
dies, everything stops: a half-running server is worse than a clear exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from types import FrameType

from cli import options
from shared.redis_server import EmbeddedRedis

_READY_TIMEOUT_S = 300.0  # the first start converts the bundled model (about 35 s on 2 cores)
_STOP_TIMEOUT_S = 15.0


class _Stop(Exception):
    """Ctrl-C or SIGTERM arrived; unwinds the supervisor from its wait loops."""


def serve(args: argparse.Namespace, flags: dict[str, options.Flags]) -> int:
    common = options.to_argv(options.given(args, flags["serve_common"]), flags["serve_common"])
    gateway_argv = common + options.to_argv(
        options.given(args, flags["serve_gateway"]), flags["serve_gateway"]
    )
    worker_argv = common + options.to_argv(options.given(args, flags["serve_worker"]), flags["serve_worker"])
    redis = None if getattr(args, "redis_url", None) else EmbeddedRedis()
    children: list[subprocess.Popen[bytes]] = []
    stop = _stop_on_signals()
    try:
        redis_url = args.redis_url if redis is None else redis.start().url
        children.append(_spawn("worker", ["--redis-url", redis_url, *worker_argv]))
        gateway_address = ["--host", args.host, "--port", str(args.port)]
        children.append(_spawn("gateway", ["--redis-url", redis_url, *gateway_address, *gateway_argv]))
        model = _wait_until_ready(args.host, args.port, children, stop)
        _print_banner(args.host, args.port, model, redis_url, embedded=redis is not None)
        return _wait_for_exit(children, stop)
    except _Stop:
        return 0
    finally:
        _stop_all(children)
        if redis is not None:
            redis.stop()
        print("tokenferry: stopped", file=sys.stderr)


def _spawn(role: str, argv: list[str]) -> subprocess.Popen[bytes]:
    # A new process group: Ctrl-C reaches only the supervisor, which stops children in order.
    return subprocess.Popen([sys.executable, "-m", "cli", role, *argv], start_new_session=True)


def _stop_on_signals() -> threading.Event:
    """An event set by Ctrl-C or SIGTERM, polled by the wait loops (raising in a handler can cut a write)."""
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    return stop


def _pause(stop: threading.Event, seconds: float) -> None:
    if stop.wait(seconds):
        raise _Stop


def _wait_until_ready(
    host: str, port: int, children: list[subprocess.Popen[bytes]], stop: threading.Event
) -> str:
    """Block until the gateway answers and lists a model; return the model's name."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    url = f"http://{_client_host(host)}:{port}/v1/models"
    while time.monotonic() < deadline:
        for child in children:
            if child.poll() is not None:
                raise SystemExit(
                    f"tokenferry: a child process exited with code {child.returncode} during start-up"
                )
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(url, timeout=2) as response:
                models = json.load(response)["data"]
                if models:
                    return str(models[0]["id"])
        _pause(stop, 0.5)
    raise SystemExit(f"tokenferry: not ready after {_READY_TIMEOUT_S:.0f} s")


def _wait_for_exit(children: list[subprocess.Popen[bytes]], stop: threading.Event) -> int:
    while True:
        for child in children:
            if child.poll() is not None:
                print(
                    f"tokenferry: a child process exited with code {child.returncode}; stopping",
                    file=sys.stderr,
                )
                return child.returncode or 1
        _pause(stop, 0.5)


def _stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon the children
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _print_banner(host: str, port: int, model: str, redis_url: str, *, embedded: bool) -> None:
    base = f"http://{_client_host(host)}:{port}/v1"
    redis_note = "private Redis" if embedded else "Redis"
    print(
        f"""
tokenferry is serving {model} at {base}  ({redis_note} at {redis_url}; Ctrl-C stops everything)

  curl {base}/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{base}", api_key="not-needed")
stream = client.chat.completions.create(
    model="{model}", messages=[{{"role": "user", "content": "What is the capital of France?"}}], stream=True)
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
PY
""",
        flush=True,
    )
