"""Owns what tests of real tokenferry processes share: start them, await a model, stop them, read SSE.

The processes stay in the test run's process group (``own_session=False``): a Ctrl-C
in the terminal reaches them too, even where pytest skips a fixture's teardown.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from shared.supervisor import (
    Child,
    ChildExited,
    NotReady,
    Output,
    cli_command,
    served_models,
    stop,
    wait_until,
)


def wait_for_model(base_url: str, processes: Sequence[Child], model: str, timeout_s: float) -> None:
    """Block until ``model`` is listed by the gateway; fail if a process exits first.

    Other tests' workers may share the session's Redis, so the model is awaited by name.
    """
    try:
        wait_until(
            lambda: model in served_models(base_url, timeout_s=5),
            processes,
            timeout_s=timeout_s,
            what=model,
            interval_s=0.2,
        )
    except ChildExited as failure:
        exited = failure.child
        output = exited.stdout.read().decode() if exited.stdout else "(see its log)"
        raise AssertionError(f"a process exited during start-up: {output}") from None
    except NotReady:
        raise AssertionError(f"{model} was not served within {timeout_s} s") from None


def stop_all(processes: Sequence[Child], timeout_s: float = 30.0) -> None:
    stop(processes, grace_s=timeout_s)


@contextmanager
def serving(base_url: str, processes: Sequence[Child], model: str, timeout_s: float) -> Iterator[str]:
    """``base_url`` once ``model`` is served there; ``processes`` stopped on exit, whatever the exit."""
    try:
        wait_for_model(base_url, processes, model, timeout_s)
        yield base_url
    finally:
        stop_all(processes)


def spawn_cli(*argv: str, env: dict[str, str] | None = None, output: Output = subprocess.PIPE) -> Child:
    """``tokenferry <argv>`` as a child process, its output captured (or sent to ``output``)."""
    return Child(
        argv[0] if argv else "tokenferry",
        cli_command(*argv),
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        output=output,
        own_session=False,
    )


def run_cli(
    *argv: str, env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``tokenferry <argv>`` run until it exits by itself, its stdout and stderr captured apart."""
    return subprocess.run(
        cli_command(*argv),
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@dataclass
class SseEvent:
    id: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def parse_sse(lines: list[str]) -> list[SseEvent]:
    """Events from raw SSE lines (comments skipped, multi-line data joined)."""
    events: list[SseEvent] = []
    event_id: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                events.append(SseEvent(event_id, "\n".join(data)))
            event_id, data = None, []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    if data:
        events.append(SseEvent(event_id, "\n".join(data)))
    return events


def chat_text(events: list[SseEvent]) -> str:
    """The assistant text of choice 0 in a chat stream's events."""
    parts = []
    for event in events:
        if event.data == "[DONE]":
            continue
        for choice in event.json().get("choices", []):
            if choice["index"] == 0:
                parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


class StreamReader:
    """Reads one SSE response line by line, keeping every event it saw."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines: list[str] = []
        self._iterator: AsyncIterator[str] = response.aiter_lines()

    @property
    def events(self) -> list[SseEvent]:
        return parse_sse(self.lines)

    async def until_text(self, length: int) -> None:
        """Read until choice 0 has at least ``length`` characters of text."""
        async for line in self._iterator:
            self.lines.append(line)
            if not line and len(chat_text(self.events)) >= length:
                return
        raise AssertionError(f"the stream ended before {length} characters: {self.lines}")

    async def rest(self) -> None:
        async for line in self._iterator:
            self.lines.append(line)


def read_until_serving(serve: Child) -> str:
    """``tokenferry serve``'s output up to its banner; fails if serve exits first."""
    assert serve.stdout is not None
    output = ""
    while "tokenferry is serving" not in output:
        line = serve.stdout.readline().decode()
        assert line, f"serve exited before it was ready:\n{output}"
        output += line
    return output
