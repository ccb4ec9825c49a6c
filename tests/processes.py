"""Helpers for tests that run real tokenferry processes: wait until a model is served, stop them all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx


def wait_for_model(
    base_url: str, processes: list[subprocess.Popen[bytes]], model: str, timeout_s: float
) -> None:
    """Block until ``model`` is listed by the gateway; fail if a process exits first.

    Other tests' workers may share the session's Redis, so the model is awaited by name.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = [process for process in processes if process.poll() is not None]
        if exited:
            output = exited[0].stdout.read().decode() if exited[0].stdout else "(see its log)"
            raise AssertionError(f"a process exited during start-up: {output}")
        try:
            served = httpx.get(f"{base_url}/v1/models", timeout=5).json()["data"]
            if any(entry["id"] == model for entry in served):
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{model} was not served within {timeout_s} s")


def stop_all(processes: list[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()


def spawn_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``tokenferry <argv>`` as a child process, its output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
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
