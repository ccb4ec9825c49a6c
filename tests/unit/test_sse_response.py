"""The gateway's SSE response at the ASGI level: frames as sent, keep-alives, the send timeout, on_close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sse_starlette.sse import SendTimeoutError

from gateway.http import sse

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


class Client:
    """An ASGI server's side of one response: what was sent, and a send that can stall."""

    def __init__(self, stall_after: int | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self._stall_after = stall_after
        self._gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        bodies = sum(1 for sent in self.messages if sent["type"] == "http.response.body")
        if self._stall_after is not None and message["type"] == "http.response.body" and bodies >= self._stall_after:
            await asyncio.Event().wait()  # a reader that takes no more bytes
        self.messages.append(message)

    def leave(self) -> None:
        self._gone.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


class Frames:
    """A frames generator that records whether its cleanup ran."""

    def __init__(self, frames: list[bytes], then_wait: bool = False) -> None:
        self.closed = False
        self._frames = frames
        self._then_wait = then_wait

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            for frame in self._frames:
                yield frame
            if self._then_wait:
                await asyncio.Event().wait()
        finally:
            self.closed = True


async def test_frames_go_out_as_given_then_the_end_and_on_close_runs() -> None:
    closed: list[bool] = []

    async def on_close() -> None:
        closed.append(True)

    frames = Frames([sse.data_frame('{"a":1}', "1-0"), sse.data_frame(sse.DONE)])
    client = Client()
    await sse.sse_response(frames(), on_close=on_close)(SCOPE, client.receive, client.send)

    start = client.messages[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert client.body == b'id: 1-0\ndata: {"a":1}\n\ndata: [DONE]\n\n'
    assert client.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert frames.closed and closed == [True]


async def test_an_idle_stream_gets_keepalive_comments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "KEEPALIVE_S", 0.05)
    monkeypatch.setattr(sse, "WATCH_S", 0.01)
    frames = Frames([sse.data_frame("first")], then_wait=True)
    client = Client()
    response = asyncio.create_task(sse.sse_response(frames())(SCOPE, client.receive, client.send))
    await asyncio.sleep(0.3)
    client.leave()
    await asyncio.wait_for(response, 5)

    assert client.body.startswith(b"data: first\n\n")
    assert client.body.count(b": keepalive\n\n") >= 2
    assert frames.closed  # the client left: the frames' cleanup ran


async def test_a_send_stuck_past_the_timeout_ends_the_response(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "SEND_TIMEOUT_S", 0.2)
    monkeypatch.setattr(sse, "WATCH_S", 0.02)
    closed: list[bool] = []

    async def on_close() -> None:
        closed.append(True)

    frames = Frames([sse.data_frame("one"), sse.data_frame("two"), sse.data_frame("three")], then_wait=True)
    client = Client(stall_after=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(SendTimeoutError):
        await asyncio.wait_for(sse.sse_response(frames(), on_close=on_close)(SCOPE, client.receive, client.send), 5)

    assert 0.2 <= loop.time() - started < 2
    assert client.body == b"data: one\n\n"
    assert frames.closed and closed == [True]
