"""Owns the load generator: C concurrent streaming chat requests against the gateway, timed per chunk.

It speaks raw HTTP with httpx and parses the SSE lines itself rather than use
the openai SDK, so each timestamp is taken the moment a line arrives, with no
object model in between; the request body is the one the SDK would send
(``ignore_eos`` is what ``extra_body={"ignore_eos": True}`` adds).

A level is a closed loop: C client tasks each send the next request as soon as
their previous one ends, until ``requests`` have been sent (one wave when
``requests == C``). ``max_seconds`` bounds the level: at the deadline, requests
not yet sent are dropped and those in flight are cancelled (the gateway then
aborts their jobs) and marked ``truncated``; their tokens so far still count.

At C=1 a level can take an ``after_request`` hook (``bench.prefill`` measures the
in-process prefill of the same prompt there): it is called with the index of each
request that ended, before the next is sent, on the event loop's thread on purpose,
so that nothing of the level runs while it does. The level's clock stops meanwhile:
the hook's time pushes the deadline back and is left out of ``wall_s``. Those requests
also open a fresh connection each (no keep-alive): the hook takes about as long as the
keep-alive expiry of httpx and uvicorn (5 s), so a reused connection would be open
for some requests and not for others, or be closed under one as it is sent.

Intentional divergence: the client runs on the same 2 cores as the worker and
gateway, so at C=64 its parsing competes with them; the numbers describe the
whole box, as a user of a single-machine deployment would see them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.prompts import chat_messages, user_prompt
from bench.stats import RequestRecord

# Extra fields of the request body, by the request's index in its level.
ExtraBody = Callable[[int], dict[str, Any]]
SETTLE_AFTER_TRUNCATION_S = 3.0  # lets the worker drop aborted sequences before the next level
# The unmeasured warm-up request; the in-process prefill reference replays it (``bench.prefill``).
WARM_UP_PROMPT = "Say hello."
WARM_UP_TOKENS = 8


@dataclass(frozen=True)
class LevelRun:
    records: list[RequestRecord]
    wall_s: float
    deadline_hit: bool


@dataclass
class _PausedHook:
    """Runs the after-request hook with the level's clock stopped."""

    hook: Callable[[int], None]
    deadline: asyncio.Timeout
    paused_s: float = 0.0

    def run(self, index: int) -> None:
        started = time.perf_counter()
        self.hook(index)  # blocks the loop on purpose: no request of the level may run meanwhile
        paused = time.perf_counter() - started
        self.paused_s += paused
        # Rescheduled before the loop runs again, so the old deadline cannot fire in between.
        when = self.deadline.when()
        if when is not None:
            self.deadline.reschedule(when + paused)


def _request_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": chat_messages(prompt),
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def _consume_line(record: RequestRecord, line: str) -> None:
    """Apply one SSE line to the record: content chunks are timed, the usage chunk gives the tokens."""
    if not line.startswith("data:"):
        return  # blank separators, comments (keepalives), event/id fields
    payload = line.removeprefix("data:").strip()
    if payload == "[DONE]":
        return
    chunk = json.loads(payload)
    if "error" in chunk:
        record.error = f"stream error: {chunk['error'].get('message', chunk['error'])}"
        return
    choices = chunk.get("choices") or []
    content = (choices[0].get("delta") or {}).get("content") if choices else None
    if content:
        record.chunk_times.append(time.perf_counter())
        record.content += content
    usage = chunk.get("usage")
    if usage:
        record.completion_tokens = int(usage["completion_tokens"])


async def stream_chat(client: httpx.AsyncClient, record: RequestRecord, body: dict[str, Any]) -> None:
    """Send one streaming chat request and fill ``record``; errors are recorded, cancellation re-raised."""
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:200]}"
                return
            async for line in response.aiter_lines():
                _consume_line(record, line)
    except asyncio.CancelledError:
        record.truncated = True
        raise
    except (httpx.HTTPError, ValueError) as error:
        record.error = f"{type(error).__name__}: {error}"
    finally:
        record.finished_at = time.perf_counter()


async def _client_task(
    client: httpx.AsyncClient,
    indices: itertools.count[int],
    records: list[RequestRecord],
    *,
    model: str,
    requests: int,
    max_tokens: int,
    first_prompt: int,
    after_request: _PausedHook | None,
    extra_body: ExtraBody | None,
) -> None:
    while (index := next(indices)) < requests:
        record = RequestRecord(index=index, started_at=time.perf_counter())
        records.append(record)
        body = _request_body(model, user_prompt(first_prompt + index), max_tokens)
        await stream_chat(client, record, body | (extra_body(index) if extra_body else {}))
        if after_request is not None:
            after_request.run(index)


async def run_level(
    base_url: str,
    model: str,
    *,
    concurrency: int,
    requests: int,
    max_tokens: int,
    max_seconds: float,
    first_prompt: int = 0,
    after_request: Callable[[int], None] | None = None,
    extra_body: ExtraBody | None = None,
) -> LevelRun:
    """Run one sweep level and return every request's record.

    ``after_request`` (C=1 only) is called with each ended request's index, with the level's clock stopped.
    ``extra_body`` gives request ``index``'s extra fields (``response_format``: ``bench.structured``).
    """
    if after_request is not None and concurrency != 1:
        raise ValueError("after_request blocks the event loop: only a C=1 level can take it")
    records: list[RequestRecord] = []
    indices = itertools.count()
    keep_alive = 0 if after_request else concurrency
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=keep_alive)
    timeout = httpx.Timeout(max_seconds + 60.0, connect=30.0)
    deadline_hit = False
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(max_seconds) as deadline, asyncio.TaskGroup() as group:
                hook = _PausedHook(after_request, deadline) if after_request else None
                for _ in range(concurrency):
                    group.create_task(
                        _client_task(
                            client,
                            indices,
                            records,
                            model=model,
                            requests=requests,
                            max_tokens=max_tokens,
                            first_prompt=first_prompt,
                            after_request=hook,
                            extra_body=extra_body,
                        )
                    )
        except TimeoutError:
            deadline_hit = True
        wall_s = time.perf_counter() - started - (hook.paused_s if hook else 0.0)
    if deadline_hit:
        await asyncio.sleep(SETTLE_AFTER_TRUNCATION_S)
    return LevelRun(records=records, wall_s=wall_s, deadline_hit=deadline_hit)


async def warm_up(base_url: str, model: str, timeout_s: float) -> RequestRecord:
    """One short request, not measured: the worker's first forward passes are slow."""
    record = RequestRecord(index=-1, started_at=time.perf_counter())
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as client:
        await stream_chat(client, record, _request_body(model, WARM_UP_PROMPT, WARM_UP_TOKENS))
    return record
