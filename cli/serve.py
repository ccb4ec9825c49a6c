"""Owns ``tokenferry serve``: supervises Redis, one gateway and one worker; Ctrl-C stops them all.

The children are the same ``tokenferry gateway`` / ``tokenferry worker`` processes
production runs, so the all-in-one mode exercises the real topology. If any child
dies, everything stops: a half-running server is worse than a clear exit.

Before starting anything it checks that the port is free; the banner comes only
once the gateway answering there is this tokenferry (its ``/version``) and it serves
the worker's model (``/ready``). While the worker loads (a first start may download
gigabytes), a "loading model" line says so every few seconds, up to ``--ready-timeout``.

Secrets (the Redis URL, which may hold a password, and the API keys) reach the
children in their environment as ``TOKENFERRY_*`` variables, never on their
command lines, which every local user can read (``ps``); the banner masks the password.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from pydantic import ValidationError

from cli import options
from cli.preflight import require_free_port
from shared import __version__
from shared.jobs.jobqueue import redacted_url
from shared.os_scheduling import batch_relays, worker_batches
from shared.protocol import PROTOCOL_VERSION
from shared.redis_server import EmbeddedRedis, RedisServerError
from shared.settings import WorkerSettings
from shared.supervisor import (
    ChildExited,
    NotReady,
    StopRequested,
    Supervisor,
    cli_command,
    ctrl_c_ignored,
    get_json,
    stop_on_signals,
    with_environment,
)

_STOP_TIMEOUT_S = 15.0
PROGRESS_EVERY_S = 10.0  # a "loading model" line this often while the worker loads (or downloads)


def serve(args: argparse.Namespace, flags: dict[str, options.Flags]) -> int:
    require_free_port("serve", args.host, args.port)  # before anything starts: nothing to stop yet
    common_values = options.given(args, flags["serve_common"])
    common = options.to_argv(common_values, flags["serve_common"])
    gateway_values = options.given(args, flags["serve_gateway"])
    key_env = _secret_env(gateway_values)  # takes the keys out of the values turned into flags
    gateway_argv = common + options.to_argv(gateway_values, flags["serve_gateway"])
    worker_values = options.given(args, flags["serve_worker"])
    worker_argv = common + options.to_argv(worker_values, flags["serve_worker"])
    worker_settings = _worker_settings({**common_values, **worker_values})
    model = None if worker_settings is None else worker_settings.model_name
    relays_batch = worker_settings is not None and worker_batches(
        worker_settings.os_scheduling, worker_settings.engine
    )
    redis = None if getattr(args, "redis_url", None) else EmbeddedRedis()
    # Children lead groups of their own: Ctrl-C reaches only this process, which stops them in order.
    supervisor = Supervisor(grace_s=_STOP_TIMEOUT_S)
    stop = stop_on_signals()
    try:
        if redis is None:
            redis_url = children_url = args.redis_url
        else:
            # The banner names the TCP address (redis-cli reaches it); the children, on this machine,
            # use the private server's socket, which spares every command the TCP stack.
            redis_url, children_url = redis.start().url, redis.socket_url
        redis_env = {"TOKENFERRY_REDIS_URL": children_url}
        supervisor.start("worker", cli_command("worker", *worker_argv), env=with_environment(redis_env))
        gateway_address = ["--host", args.host, "--port", str(args.port)]
        gateway_env = with_environment({**redis_env, **key_env})
        gateway = supervisor.start(
            "gateway", cli_command("gateway", *gateway_address, *gateway_argv), env=gateway_env
        )
        base_url = f"http://{_client_host(args.host)}:{args.port}"
        model = _wait_until_ready(base_url, model, supervisor, stop, args.ready_timeout)
        if relays_batch:  # beside vLLM's engine core: relaying never preempts its threads
            batch_relays(gateway.pid, None if redis is None else redis.pid)
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


def _worker_settings(values: dict[str, Any]) -> WorkerSettings | None:
    """The worker's settings as it will read them; None where they are invalid (it says why)."""
    try:
        return WorkerSettings(**values)
    except (ValidationError, ValueError):
        return None


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


def _wait_until_ready(
    base_url: str, model: str | None, supervisor: Supervisor, stop: threading.Event, timeout_s: float
) -> str:
    """Block until tokenferry's gateway at ``base_url`` serves ``model``; return the model's name."""
    progress = LoadingProgress(model or "the model")

    def ready() -> str:
        progress.tick()
        return served_here(base_url, model)

    try:
        return supervisor.wait_until(
            ready, timeout_s=timeout_s or math.inf, what="the model", interval_s=0.5, stop_event=stop
        )
    except ChildExited as exited:
        child = exited.child
        raise SystemExit(
            f"tokenferry serve: the {child.name} exited with code {child.returncode} during start-up "
            f"(its message is above); stopping"
        ) from None
    except NotReady:
        raise SystemExit(
            f"tokenferry serve: {model or 'the model'} was not served within {timeout_s:.0f} s; stopping. "
            f"A first start may still be downloading it: raise --ready-timeout, or 0 for no limit"
        ) from None


def served_here(base_url: str, model: str | None) -> str:
    """``model`` once this tokenferry gateway serves it (any model where None), else "".

    ``/version`` must be this tokenferry's, so another server on the port is never
    announced; ``/ready`` needs no API key and answers 503 (an ``OSError``) until a
    worker is live.
    """
    version = get_json(f"{base_url}/version")
    if (version.get("version"), version.get("protocol_version")) != (__version__, PROTOCOL_VERSION):
        raise ValueError(f"{base_url} is not this tokenferry: {version}")
    served = get_json(f"{base_url}/ready").get("models")
    if not isinstance(served, list) or not served:
        return ""
    if model is None:
        return str(served[0])
    return model if model in served else ""


class LoadingProgress:
    """Says the server is still loading: at once, then every ``PROGRESS_EVERY_S`` seconds, on stderr."""

    def __init__(
        self,
        model: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        out: IO[str] | None = None,
    ) -> None:
        self._model = model
        self._clock = clock
        self._out = out
        self._started = clock()
        self._next = self._started

    def tick(self) -> None:
        now = self._clock()
        if now >= self._next:
            print(loading_line(self._model, now - self._started), file=self._out or sys.stderr, flush=True)
            self._next = now + PROGRESS_EVERY_S


def loading_line(model: str, elapsed_s: float) -> str:
    """``tokenferry serve: loading model M... (40 s)``; the first line says why it may take long."""
    if elapsed_s < 1:
        return f"tokenferry serve: loading model {model}... (a first start may download or convert it)"
    return f"tokenferry serve: loading model {model}... ({elapsed_s:.0f} s)"


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
