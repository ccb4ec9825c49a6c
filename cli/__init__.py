"""Owns the ``tokenferry`` command: parses subcommands and starts the right process.

The one place that may import both tiers, lazily, per subcommand: the gateway
never imports torch, and a client command imports neither tier.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from cli import options
from shared.logs import configure_logging

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

_S = TypeVar("_S", bound="BaseSettings")


# Options of ``serve`` itself rather than of the processes it starts: no settings field.
SERVE_ONLY = ("ready_timeout",)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, options.Flags]]:
    from shared import __version__
    from shared.settings import GatewaySettings, WorkerSettings
    from shared.settings_base import TokenferrySettings

    parser = argparse.ArgumentParser(
        prog="tokenferry", description="OpenAI-compatible serving of HuggingFace LMs."
    )
    parser.add_argument("--version", action="version", version=f"tokenferry {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=help_text, description=help_text, argument_default=argparse.SUPPRESS
        )

    serve = command("serve", "all in one: Redis (unless --redis-url), one gateway and one worker")
    # serve reads these three itself: it starts its own Redis without --redis-url, and hands
    # the gateway its address.
    own = ("host", "port", "redis_url")
    actions = options.add_settings_flags(serve, [GatewaySettings, WorkerSettings], keep_defaults=own[:2])
    common = [*own, *TokenferrySettings.model_fields]
    flags = {
        "serve_common": options.flags_of(actions, TokenferrySettings, skip=own),
        "serve_gateway": options.flags_of(actions, GatewaySettings, skip=common),
        "serve_worker": options.flags_of(actions, WorkerSettings, skip=common),
    }
    # serve's own option, not a setting of either process it starts (SERVE_ONLY).
    serve.add_argument(
        "--ready-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="stop if the model is not served within S seconds (a first start may download it; 0: no limit)",
    )

    gateway = command("gateway", "the HTTP gateway (scale out behind a load balancer)")
    actions = options.add_settings_flags(gateway, [GatewaySettings])
    flags["gateway"] = options.flags_of(actions, GatewaySettings)
    worker = command("worker", "a generation worker for one model")
    actions = options.add_settings_flags(worker, [WorkerSettings])
    flags["worker"] = options.flags_of(actions, WorkerSettings)

    from cli.client import add_client_commands

    add_client_commands(commands)
    from cli.status import add_status_command

    add_status_command(commands)
    from cli.keys import add_key_commands

    add_key_commands(commands)
    from cli.batch import add_batch_commands

    add_batch_commands(commands)
    return parser, flags


def main(argv: Sequence[str] | None = None) -> None:
    parser, flags = _parser()
    args = parser.parse_args(argv)
    if args.command == "gateway":
        _run_gateway(options.given(args, flags["gateway"]))
    elif args.command == "worker":
        _run_worker(options.given(args, flags["worker"]))
    elif args.command == "serve":
        from cli.serve import serve

        sys.exit(serve(args, flags))
    else:
        sys.exit(args.handler(args))


def _settings(model: type[_S], values: dict[str, object], command: str) -> _S:
    """The settings, or one line per invalid value naming its flag (not a pydantic traceback)."""
    from pydantic import ValidationError

    try:
        return model(**values)  # type: ignore[arg-type]
    except ValidationError as error:
        lines = [f"tokenferry {command}: {_invalid(problem)}" for problem in error.errors()]
        raise SystemExit("\n".join(lines)) from None


def _invalid(problem: Any) -> str:
    message = str(problem["msg"]).removeprefix("Value error, ")
    if not problem["loc"]:
        return message
    field = str(problem["loc"][0])
    return f"invalid {field} ({options.flag_name(field)}, {options.env_name(field)}): {message}"


# uvicorn's production choices, named rather than left to its "auto", which falls back to
# asyncio's loop and h11 without a word when uvloop or httptools is missing (before they
# were gateway dependencies, it did: up to ~15 % more gateway CPU per token, docs/performance.md).
# uvloop has no Windows build (pyproject's marker); asyncio's loop is what runs there.
GATEWAY_EVENT_LOOP = "asyncio" if sys.platform == "win32" else "uvloop"
GATEWAY_HTTP = "httptools"


def _run_gateway(values: dict[str, object]) -> None:
    import uvicorn

    from cli.preflight import require_free_port, require_redis
    from gateway.http.app import create_app
    from shared.settings import GatewaySettings

    settings = _settings(GatewaySettings, values, "gateway")
    # One line each instead of uvicorn's lifespan traceback or a bind error after start-up.
    require_free_port("gateway", settings.host, settings.port)
    for url in settings.model_groups().urls():  # the home Redis, then each model group's
        require_redis("gateway", url, settings.redis_timeout_s)
    configure_logging(settings.log_level, settings.log_format, process="gateway")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # keep our handlers and request-id filter
        loop=GATEWAY_EVENT_LOOP,
        http=GATEWAY_HTTP,
        # Open streams get the drain grace (sse-starlette's), then a little for the rest to close.
        timeout_graceful_shutdown=int(settings.drain_grace_s) + 5,
    )


def _run_worker(values: dict[str, object]) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from cli.preflight import WORKER_REDIS_TIMEOUT_S, redis_problem, require_redis
    from shared.settings import WorkerSettings
    from worker.main import run_worker
    from worker.model.sources import ModelLoadError

    settings = _settings(WorkerSettings, values, "worker")
    if settings.engine == "vllm":
        from worker.engine.vllm_adapter.launch import vllm_missing

        if missing := vllm_missing():
            sys.exit(f"tokenferry worker: {missing}")
    # One line, before arq's log lines; a worker's Redis is its model group's.
    require_redis("worker", settings.model_redis_url, WORKER_REDIS_TIMEOUT_S)
    worker_id = {"worker_id": settings.worker_id} if settings.worker_id else {}
    configure_logging(settings.log_level, settings.log_format, process="worker", **worker_id)
    try:
        run_worker(settings)
    except RedisConnectionError as error:
        sys.exit(redis_problem("worker", settings.model_redis_url, error))
    except ModelLoadError as error:
        sys.exit(f"tokenferry worker: {error}")
