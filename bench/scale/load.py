"""Owns the scale bench's load generator: many SSE streams from one process, timed per token.

Run as ``python -m bench.scale.load '<json LoadPlan>'`` by the orchestrator, which may start
several of them (one per core is the most that helps). Thousands of streams in one Python
process are affordable only without an HTTP library: each stream is a raw asyncio
connection, the request is written by hand, and the response is never parsed as HTTP
chunks or JSON. One regex over each read finds the SSE frames that carry content and
their ``id:`` (the Redis stream entry id the gateway relays, ``<ms>-<seq>``). uvicorn
writes each SSE frame as one HTTP chunk, so a frame is never cut by a chunk header; a
frame cut by a read boundary is kept for the next read.

Added latency per token: the worker's events are XADDed with ``*`` ids, so an entry id's
milliseconds are Redis's clock when the worker's publish reached it (same machine, same
clock as ``time.time()`` here). receive time - entry ms is then the whole relay: Redis,
the gateway's shared reader, rendering, SSE, loopback TCP and this client's event loop.
The id truncates to the millisecond, so each figure overstates by 0 to 1 ms.

Two modes: ``hold`` opens ``streams`` long requests and keeps them open until the window
ends (the gateway's concurrent-stream sweep), ``loop`` runs ``streams`` clients each
sending requests of ``max_tokens`` back to back (whole requests, enqueue to finish).
Either way only what arrives inside [window_start, window_start + window_s] counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, fields

# A content frame: its id then a data line whose delta has non-empty content.
CONTENT_FRAME = re.compile(rb'(?:^|\n)id: (\d+)-\d+\ndata: [^\n]*?"content":"[^"]')
_DONE = b"data: [DONE]"
_READ = 1 << 16


@dataclass(frozen=True)
class LoadPlan:
    host: str
    ports: list[int]  # gateways: stream i goes to ports[i % len(ports)]
    model: str
    mode: str  # "hold" or "loop"
    streams: int
    max_tokens: int
    window_s: float
    window_start: float = 0.0  # time.time(); 0: told on stdin once every stream streams
    open_per_s: float = 400.0  # how fast new streams are opened at first
    ramp_timeout_s: float = 60.0  # the most to wait for every stream's first token


@dataclass
class LoadResult:
    streams: int = 0
    streaming_at_window_start: int = 0  # streams that had their first content token by then
    tokens: int = 0  # content frames received inside the window
    requests_finished: int = 0  # [DONE] inside the window
    errors: Counter[str] = field(default_factory=Counter)
    latency_ms: Counter[int] = field(default_factory=Counter)  # 1 ms bins, inside the window
    cpu_s: float = 0.0  # this process's user+sys CPU inside the window
    first_token_times: list[float] = field(default_factory=list)  # stream -> first content frame


class _Load:
    def __init__(self, plan: LoadPlan) -> None:
        self.plan = plan
        self.result = LoadResult(streams=plan.streams)
        self.window_start = plan.window_start or float("inf")
        self.window_end = self.window_start + plan.window_s
        body = {
            "model": plan.model,
            "messages": [{"role": "user", "content": "scale"}],
            "max_tokens": plan.max_tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
        }
        self.body = json.dumps(body).encode()
        self.all_streaming = asyncio.Event()

    def request(self, port: int) -> bytes:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self.plan.host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n\r\n"
        )
        return head.encode() + self.body

    async def one_request(self, port: int) -> bool:
        """One streamed request to its end (or the window's); False when it failed."""
        try:
            reader, writer = await asyncio.open_connection(self.plan.host, port, limit=_READ * 4)
        except OSError as error:
            self.result.errors[type(error).__name__] += 1
            return False
        try:
            writer.write(self.request(port))
            status = await reader.readline()
            if b" 200 " not in status:
                self.result.errors[status.decode(errors="replace").strip()[:40] or "no status"] += 1
                return False
            return await self._frames(reader)
        except (OSError, asyncio.IncompleteReadError) as error:
            self.result.errors[type(error).__name__] += 1
            return False
        finally:
            writer.close()

    async def _frames(self, reader: asyncio.StreamReader) -> bool:
        carry, first = b"", True
        result = self.result
        while True:
            window_start, window_end = self.window_start, self.window_end
            data = await reader.read(_READ)
            now = time.time()
            if not data:
                result.errors["closed"] += 1
                return False
            if now >= window_end:
                return True  # the window is over: hang up
            buffer = carry + data
            cut = buffer.rfind(b"\n\n") + 2  # frames end with a blank line
            carry, whole = buffer[cut:], buffer[:cut]
            ids = CONTENT_FRAME.findall(whole)
            if ids and first:
                first = False
                result.first_token_times.append(now)
                if len(result.first_token_times) >= self.plan.streams:
                    self.all_streaming.set()
            if now >= window_start:
                result.tokens += len(ids)
                now_ms = now * 1000.0
                for entry_ms in ids:
                    result.latency_ms[int(now_ms - int(entry_ms))] += 1
            if _DONE in whole:
                if now >= window_start:
                    result.requests_finished += 1
                return True

    async def client(self, index: int) -> None:
        port = self.plan.ports[index % len(self.plan.ports)]
        await asyncio.sleep(index / self.plan.open_per_s)  # a ramp, not a thundering herd
        while time.time() < self.window_end:
            ok = await self.one_request(port)
            if self.plan.mode == "hold" or not ok:
                if not ok:
                    await asyncio.sleep(0.2)
                if self.plan.mode == "hold":
                    return

    async def run(self) -> LoadResult:
        tasks = [asyncio.create_task(self.client(index)) for index in range(self.plan.streams)]
        if not self.plan.window_start:
            await self._ramp()
        await asyncio.sleep(max(0.0, self.window_start - time.time()))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_before = usage.ru_utime + usage.ru_stime
        self.result.streaming_at_window_start = len(self.result.first_token_times)
        await asyncio.sleep(max(0.0, self.window_end - time.time()))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.result.cpu_s = usage.ru_utime + usage.ru_stime - cpu_before
        # Streams still open wake on their next read past the window and hang up.
        _done, pending = await asyncio.wait(tasks, timeout=15)
        for task in pending:
            task.cancel()
        return self.result

    async def _ramp(self) -> None:
        """Say when every stream has its first token (or the ramp timed out); read the window's start."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_streaming.wait(), self.plan.ramp_timeout_s)
        print(json.dumps({"streaming": len(self.result.first_token_times)}), flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        self.window_start = float(line)
        self.window_end = self.window_start + self.plan.window_s


def main() -> None:
    plan = LoadPlan(**json.loads(sys.argv[1]))
    result = asyncio.run(_Load(plan).run())
    # Not ``asdict``: it rebuilds a Counter from (key, value) pairs, counting the pairs.
    out = {item.name: getattr(result, item.name) for item in fields(result)}
    out["errors"] = dict(result.errors)
    out["latency_ms"] = {str(key): value for key, value in result.latency_ms.items()}
    out["first_token_times"] = sorted(result.first_token_times)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
