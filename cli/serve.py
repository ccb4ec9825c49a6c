"""Owns ``tokenferry serve``: supervises Redis, one gateway and one worker; Ctrl-C stops them all.

The children are the same ``tokenferry gateway`` / ``tokenferry worker`` processes
production runs, so the all-in-one mode exercises the real topology. If any child
dies, everything stops: a half-running server is worse than a clear exit.

Secrets (the Redis URL, which may hold a password, and the API keys) reach the
children in their environment as ``TOKENFERRY_*`` variables, never on their
command lines, which every local user can read (``ps``); the banner masks the password.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from cli import options
from shared.jobs.jobqueue import redacted_url
from shared.redis_server import EmbeddedRedis, RedisServerError
from shared.supervisor import (
    ChildExited,
    NotReady,
    StopRequested,
    Supervisor,
    cli_command,
    ctrl_c_ignored,
    served_models,
    stop_on_signals,
    with_environment,
)

_READY_TIMEOUT_S = 300.0  # the first start converts the bundled model (about 35 s on 2 cores)
_STOP_TIMEOUT_S = 15.0


def serve(args: argparse.Namespace, flags: dict[str, options.Flags]) -> int:
    common = options.to_argv(options.given(args, flags["serve_common"]), flags["serve_common"])
    gateway_values = options.given(args, flags["serve_gateway"])
    key_env = _secret_env(gateway_values)  # takes the keys out of the values turned into flags
    gateway_argv = common + options.to_argv(gateway_values, flags["serve_gateway"])
    worker_argv = common + options.to_argv(options.given(args, flags["serve_worker"]), flags["serve_worker"])
    redis = None if getattr(args, "redis_url", None) else EmbeddedRedis()
    # Children lead groups of their own: Ctrl-C reaches only this process, which stops them in order.
    supervisor = Supervisor(grace_s=_STOP_TIMEOUT_S)
    stop = stop_on_signals()
    try:
        redis_url = args.redis_url if redis is None else redis.start().url
        redis_env = {"TOKENFERRY_REDIS_URL": redis_url}
        supervisor.start("worker", cli_command("worker", *worker_argv), env=with_environment(redis_env))
        gateway_address = ["--host", args.host, "--port", str(args.port)]
        gateway_env = with_environment({**redis_env, **key_env})
        supervisor.start("gateway", cli_command("gateway", *gateway_address, *gateway_argv), env=gateway_env)
        model = _wait_until_ready(args.host, args.port, supervisor, stop)
        _print_banner(args.host, args.port, model, redis_url, embedded=redis is not None)
        return _wait_for_exit(supervisor, stop)
    except StopRequested:
        return 0
    except RedisServerError as error:
        raise SystemExit(f"tokenferry serve: {error}") from None
    finally:
        with ctrl_c_ignored():
            supervisor.stop()
            if redis is not None:
                redis.stop()
        print("tokenferry: stopped", file=sys.stderr)


def _secret_env(gateway_values: dict[str, Any]) -> dict[str, str]:
    """The API keys given as flags, as the gateway's environment (removed from ``gateway_values``)."""
    env: dict[str, str] = {}
    for field, flag in (("api_keys", "--api-key"), ("admin_api_keys", "--admin-api-key")):
        entries = [str(entry) for entry in gateway_values.pop(field, None) or []]
        if any("," in entry for entry in entries):
            # The environment holds a comma-separated list: such a key would arrive as two.
            raise SystemExit(f"tokenferry serve: a {flag} key cannot contain a comma")
        if entries:
            env[f"TOKENFERRY_{field.upper()}"] = ",".join(entries)
    return env


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
tokenferry is serving {model} at {base}  ({redis_note} at {redacted_url(redis_url)}; Ctrl-C stops everything)

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
