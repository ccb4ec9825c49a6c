"""Owns ``tokenferry batch``: submit a JSONL file (and wait with a progress bar), status, list, cancel.

Everything goes through the official ``openai`` SDK, so the commands work against
any OpenAI-compatible batch API. The progress bar is one line redrawn with ``\\r``
(lines done / total, lines per second, ETA), made by a pure function.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from openai import OpenAI, OpenAIError
from openai.types import Batch

from cli.client import sdk_client
from shared.settings import ClientSettings

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
BAR_WIDTH = 30


def add_batch_commands(commands: Any) -> None:
    batch = commands.add_parser("batch", help="submit and follow batches of requests")
    actions = batch.add_subparsers(dest="batch_command", required=True, metavar="ACTION")
    submit = actions.add_parser("submit", help="upload FILE.jsonl and create a batch")
    submit.add_argument("file", type=Path)
    submit.add_argument("--wait", action="store_true", help="show progress, then write the output JSONL")
    submit.add_argument("--output", type=Path, help="where --wait writes results (default FILE.output.jsonl)")
    submit.add_argument("--poll", type=float, default=1.0, help="seconds between status polls")
    submit.set_defaults(handler=run_submit)
    status = actions.add_parser("status", help="show one batch")
    status.add_argument("batch_id")
    status.set_defaults(handler=run_status)
    listing = actions.add_parser("list", help="list batches, newest first")
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(handler=run_list)
    cancel = actions.add_parser("cancel", help="cancel a batch")
    cancel.add_argument("batch_id")
    cancel.set_defaults(handler=run_cancel)
    for parser in (submit, status, listing, cancel):
        parser.add_argument("--base-url", help="default http://127.0.0.1:8000/v1 (TOKENFERRY_BASE_URL)")
        parser.add_argument("--api-key", help="Bearer key (TOKENFERRY_API_KEY)")


def _client(args: argparse.Namespace) -> OpenAI:
    # Given flags only (an empty --api-key included: it means no key), else the environment's.
    names = ("base_url", "api_key")
    values = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    return sdk_client(ClientSettings(**values))


def _guarded(handler: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except OpenAIError as error:
            print(f"tokenferry batch: {error}", file=sys.stderr)
            return 1

    return run


def _endpoint(path: Path) -> str:
    """The endpoint the file's lines call (the first line's ``url``)."""
    with path.open("rb") as handle:
        for raw in handle:
            if raw.strip():
                return str(json.loads(raw).get("url", "/v1/chat/completions"))
    return "/v1/chat/completions"


@_guarded
def run_submit(args: argparse.Namespace) -> int:
    client = _client(args)
    with args.file.open("rb") as handle:
        uploaded = client.files.create(file=handle, purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint=_endpoint(args.file),  # type: ignore[arg-type]  # checked by the server
        completion_window="24h",
    )
    print(batch.id, flush=True)
    if not args.wait:
        return 0
    batch = _follow(client, batch, args.poll)
    print(summary(batch))
    output = args.output or args.file.with_suffix(".output.jsonl")
    _write(client, batch.output_file_id, output)
    if batch.error_file_id:
        _write(client, batch.error_file_id, output.with_suffix(".errors.jsonl"))
    return 0 if batch.status == "completed" else 1


def _follow(client: OpenAI, batch: Batch, poll_s: float) -> Batch:
    started = time.monotonic()
    while batch.status not in TERMINAL:
        time.sleep(poll_s)
        batch = client.batches.retrieve(batch.id)
        counts = batch.request_counts
        done = (counts.completed + counts.failed) if counts else 0
        total = counts.total if counts else 0
        print(
            "\r" + progress_line(done, total, time.monotonic() - started), end="", file=sys.stderr, flush=True
        )
    print(file=sys.stderr)
    return batch


def _write(client: OpenAI, file_id: str | None, path: Path) -> None:
    if file_id is None:
        return
    path.write_bytes(client.files.content(file_id).content)
    print(f"wrote {path}")


def progress_line(done: int, total: int, elapsed_s: float) -> str:
    """``[#####-----] 12/40 lines  3.1 lines/s  ETA 9s``: the bar redrawn while a batch runs."""
    filled = BAR_WIDTH * done // total if total else 0
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    eta = f"{(total - done) / rate:.0f}s" if rate > 0 else "?"
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {done}/{total} lines  {rate:.1f} lines/s  ETA {eta}"


def summary(batch: Batch) -> str:
    counts = batch.request_counts
    done = (
        f"{counts.completed} completed, {counts.failed} failed of {counts.total}" if counts else "no counts"
    )
    line = f"{batch.id}  {batch.status}  {done}"
    if batch.errors and batch.errors.data:
        problems = "; ".join(f"line {error.line}: {error.message}" for error in batch.errors.data)
        line += f"\n  errors: {problems}"
    return line


@_guarded
def run_status(args: argparse.Namespace) -> int:
    batch = _client(args).batches.retrieve(args.batch_id)
    print(summary(batch))
    for name in ("output_file_id", "error_file_id"):
        if getattr(batch, name):
            print(f"  {name}: {getattr(batch, name)}")
    return 0


@_guarded
def run_list(args: argparse.Namespace) -> int:
    for batch in _client(args).batches.list(limit=args.limit).data:
        print(summary(batch))
    return 0


@_guarded
def run_cancel(args: argparse.Namespace) -> int:
    print(summary(_client(args).batches.cancel(args.batch_id)))
    return 0
