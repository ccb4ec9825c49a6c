"""Owns the command-line flags of the server processes and their mapping onto settings fields.

Flags default to ``argparse.SUPPRESS`` so only flags actually given become settings
init values: a flag then beats the environment, which beats the YAML file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from shared.settings import BUNDLED_MODEL

Flags = list[argparse.Action]


def _compile_args(value: str) -> dict[str, Any]:
    """A YAML file path or inline YAML mapping, e.g. '{mode: reduce-overhead}'."""
    path = Path(value)
    text = path.read_text() if path.is_file() else value
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        raise argparse.ArgumentTypeError("--compile-args needs a YAML mapping or a file holding one")
    return loaded


def add_common_flags(parser: argparse.ArgumentParser) -> Flags:
    add = parser.add_argument
    return [
        add("--config", dest="config_file", metavar="FILE.yaml", help="YAML file with settings keys"),
        add(
            "--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="DEBUG logs token-level detail"
        ),
        add("--log-format", choices=["text", "json"]),
    ]


def add_gateway_flags(parser: argparse.ArgumentParser) -> Flags:
    add = parser.add_argument
    return [
        add(
            "--api-key",
            dest="api_keys",
            action="append",
            metavar="KEY",
            help="accepted Bearer key (repeatable; KEY or sha256:HEX)",
        ),
        add(
            "--request-timeout",
            dest="request_timeout_s",
            type=float,
            metavar="S",
            help="queue wait + generation",
        ),
        add("--max-body-bytes", type=int, metavar="N"),
        add(
            "--max-queued-requests",
            type=int,
            metavar="N",
            help="per model: waiting requests beyond N get 429 at once",
        ),
        # The gateway's drain grace comes from TOKENFERRY_DRAIN_GRACE_S or YAML: `serve` shares one
        # parser between both processes, and --drain-grace is the worker's.
        add(
            "--redis-timeout",
            dest="redis_timeout_s",
            type=float,
            metavar="S",
            help="Redis connect timeout, and the longest wait for a free pooled connection",
        ),
        add(
            "--redis-max-connections",
            type=int,
            metavar="N",
            help="Redis connections for requests; past them 503",
        ),
        add("--stream-readers", type=int, metavar="N", help="Redis connections relaying all open streams"),
        add(
            "--admin-api-key",
            dest="admin_api_keys",
            action="append",
            metavar="KEY",
            help="accepted Bearer key that may also use /admin (repeatable; KEY or sha256:HEX)",
        ),
        add("--rate-limit-rpm", type=int, metavar="N", help="default requests per minute per key"),
        add("--rate-limit-tpm", type=int, metavar="N", help="default tokens per minute per key"),
        add("--max-tokens-limit", type=int, metavar="N", help="largest max_tokens a request may ask"),
        add(
            "--cors-allow-origin",
            dest="cors_allow_origins",
            action="append",
            metavar="ORIGIN",
            help="turn CORS on for this browser origin (repeatable; * for any)",
        ),
        add(
            "--metrics-require-key",
            action=argparse.BooleanOptionalAction,
            help="GET /metrics needs an API key (default: open to scrapers)",
        ),
        add(
            "--max-streams-per-tenant",
            type=int,
            metavar="N",
            help="SSE streams one tenant may hold open at once, on all gateways (default 64; then 429)",
        ),
        add("--max-files-per-tenant", type=int, metavar="N", help="files a tenant may store (default 1000)"),
        add(
            "--max-file-bytes-per-tenant",
            type=int,
            metavar="N",
            help="bytes of files one tenant may store (default 1 GiB)",
        ),
        add(
            "--docs-require-key",
            action=argparse.BooleanOptionalAction,
            help="/openapi.json, /docs and /redoc need an API key (default: yes, like the API)",
        ),
    ]


def add_worker_flags(parser: argparse.ArgumentParser) -> Flags:
    add = parser.add_argument
    return [
        add("--model", help=f"hub id, local directory, .gguf file, or {BUNDLED_MODEL} (default)"),
        add("--served-model-name", help="name clients use (default: --model)"),
        add("--engine", choices=["transformers", "fake"], help="fake: deterministic text, no model (tests)"),
        add("--device", help="cpu, cuda, cuda:N or auto (default)"),
        add("--dtype", choices=["auto", "float32", "float16", "bfloat16"]),
        add("--attn-implementation", help="eager, sdpa, flash_attention_2, ..."),
        add("--chat-template", type=Path, metavar="FILE", help="Jinja2 chat template overriding the model's"),
        add("--stop-sequences", nargs="+", metavar="STOP", help="server default stop sequences"),
        add("--ignore-eos", action=argparse.BooleanOptionalAction, help="server default for ignore_eos"),
        add("--compile", action=argparse.BooleanOptionalAction, help="torch.compile the model's forward"),
        add("--compile-args", type=_compile_args, metavar="YAML", help="torch.compile keyword arguments"),
        add("--cache-implementation", choices=["dynamic", "static"], help="KV cache kind"),
        add("--disable-kv-cache", action=argparse.BooleanOptionalAction),
        add("--max-model-len", type=int, metavar="N", help="context window (default: the model's)"),
        add("--max-batch-size", type=int, metavar="N", help="sequences decoding together at most"),
        add("--max-batch-tokens", type=int, metavar="N", help="KV-cache budget in tokens (rows x longest)"),
        add("--max-prefill-tokens", type=int, metavar="N", help="prompt tokens prefilled per step"),
        add(
            "--max-num-beams",
            type=int,
            metavar="N",
            help="widest beam search a request may ask for (default 8)",
        ),
        add(
            "--prefix-cache-tokens",
            type=int,
            metavar="N",
            help="prompt tokens whose KV later prompts may reuse (default 4096; 0: off)",
        ),
        add("--torch-threads", type=int, metavar="N", help="torch threads (default: one per core)"),
        add(
            "--onednn-linear",
            action=argparse.BooleanOptionalAction,
            help="CPU float32: Linear layers as oneDNN ops on pre-packed weights (default on)",
        ),
        add("--trust-remote-code", action=argparse.BooleanOptionalAction),
        add("--cache-dir", type=Path, help="where converted GGUF models are kept"),
        add("--poll-delay", dest="poll_delay_s", type=float, metavar="S", help="queue poll interval"),
        add("--worker-id", help="this worker's id in the registry (default: host-pid-random)"),
        add(
            "--batch-share",
            type=float,
            metavar="F",
            help="fraction of --max-batch-size batch-lane work may fill (default 0.75)",
        ),
        add(
            "--batch-hold",
            dest="batch_hold_s",
            type=float,
            metavar="S",
            help="batch-lane tokens are published merged at most this often (default 1.0)",
        ),
        add(
            "--drain-grace",
            dest="drain_grace_s",
            type=float,
            metavar="S",
            help="on SIGTERM, how long running sequences may finish before they are handed over",
        ),
        add("--metrics-port", type=int, metavar="PORT", help="serve Prometheus /metrics here (default: off)"),
        add("--metrics-host", metavar="ADDR", help="address of the metrics port (default 127.0.0.1)"),
    ]


def add_redis_flag(parser: argparse.ArgumentParser) -> Flags:
    return [
        parser.add_argument("--redis-url", help="redis:// URL shared by all processes (TOKENFERRY_REDIS_URL)")
    ]


def given(namespace: argparse.Namespace, flags: Flags) -> dict[str, Any]:
    """The settings values the user actually passed among ``flags``."""
    return {flag.dest: getattr(namespace, flag.dest) for flag in flags if hasattr(namespace, flag.dest)}


def to_argv(values: dict[str, Any], flags: Flags) -> list[str]:
    """Turn given values back into flags, to hand them to a child process."""
    argv: list[str] = []
    for flag in flags:
        if flag.dest in values:
            argv += _flag_argv(flag, values[flag.dest])
    return argv


def _flag_argv(flag: argparse.Action, value: Any) -> list[str]:
    name = flag.option_strings[0]
    if isinstance(flag, argparse.BooleanOptionalAction):
        return [name if value else "--no-" + name.removeprefix("--")]
    if isinstance(value, dict):
        return [name, yaml.safe_dump(value, default_flow_style=True).strip()]
    if isinstance(value, list):
        if flag.nargs in ("+", "*"):
            return [name, *map(str, value)]
        return [part for item in value for part in (name, str(item))]  # a repeatable flag
    return [name, str(value)]
