"""Owns ``tokenferry serve``: supervises Redis, one gateway and one worker; Ctrl-C stops them all.

The children are the same ``tokenferry gateway`` / ``tokenferry worker`` processes
production runs, so the all-in-one mode exercises the real topology. If any child
dies, everything stops: a half-running server is worse than a clear exit.
"""

from __future__ import annotations

import argparse
import sys
import threading

from cli import options
from shared.redis_server import EmbeddedRedis
from shared.supervisor import (
    ChildExited,
    NotReady,
    StopRequested,
    Supervisor,
    cli_command,
    ctrl_c_ignored,
    served_models,
    stop_on_signals,
)

_READY_TIMEOUT_S = 300.0  # the first start converts the bundled model (about 35 s on 2 cores)
_STOP_TIMEOUT_S = 15.0


def serve(args: argparse.Namespace, flags: dict[str, options.Flags]) -> int:
    common = options.to_argv(options.given(args, flags["serve_common"]), flags["serve_common"])
    gateway_argv = common + options.to_argv(
        options.given(args, flags["serve_gateway"]), flags["serve_gateway"]
    )
    worker_argv = common + options.to_argv(options.given(args, flags["serve_worker"]), flags["serve_worker"])
    redis = None if getattr(args, "redis_url", None) else EmbeddedRedis()
    # Children lead groups of their own: Ctrl-C reaches only this process, which stops them in order.
    supervisor = Supervisor(grace_s=_STOP_TIMEOUT_S)
    stop = stop_on_signals()
    try:
        redis_url = args.redis_url if redis is None else redis.start().url
        supervisor.start("worker", cli_command("worker", "--redis-url", redis_url, *worker_argv))
        gateway_address = ["--host", args.host, "--port", str(args.port)]
        gateway = ["gateway", "--redis-url", redis_url, *gateway_address, *gateway_argv]
        supervisor.start("gateway", cli_command(*gateway))
        model = _wait_until_ready(args.host, args.port, supervisor, stop)
        _print_banner(args.host, args.port, model, redis_url, embedded=redis is not None)
        return _wait_for_exit(supervisor, stop)
    except StopRequested:
        return 0
    finally:
        with ctrl_c_ignored():
            supervisor.stop()
            if redis is not None:
                redis.stop()
        print("tokenferry: stopped", file=sys.stderr)


def _wait_until_ready(host: str, port: int, supervisor: Supervisor, stop: threading.Event) -> str:
    """Block until the gateway answers and lists a model; return the model's name."""
    base_url = f"http://{_client_host(host)}:{port}"
    try:
        models = supervisor.wait_until(
            lambda: served_models(base_url), timeout_s=_READY_TIMEOUT_S, what="the gateway", stop_event=stop
        )
    except ChildExited as exited:
        raise SystemExit(
            f"tokenferry: a child process exited with code {exited.child.returncode} during start-up"
        ) from None
    except NotReady:
        raise SystemExit(f"tokenferry: not ready after {_READY_TIMEOUT_S:.0f} s") from None
    return models[0]


def _wait_for_exit(supervisor: Supervisor, stop: threading.Event) -> int:
    exited = supervisor.watch(stop)
    if exited is None:
        return 0
    print(f"tokenferry: a child process exited with code {exited.returncode}; stopping", file=sys.stderr)
    return exited.returncode or 1


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
