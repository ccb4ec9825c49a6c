"""Owns the SSE framing of streamed responses: chunk frames, keep-alives, errors, ``[DONE]``.

Each chunk is one ``data: <json>`` frame. The last frame made from a token event
carries that event's Redis stream entry id as its SSE ``id:``, so a client that
reconnects with ``Last-Event-ID`` names exactly where its stream stopped (a
partly received group is replayed whole rather than lost). Keep-alives are
comment lines, which the OpenAI SDKs ignore. A failure after the 200 went out
cannot change the status, so it travels in-band as ``data: {"error": {...}}``,
which the OpenAI SDK raises as an APIError, and the stream ends without ``[DONE]``.

Frames use ``\\n`` line endings: the SSE spec allows all three, and ``\\n`` is what
OpenAI itself sends.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import aclosing
from typing import Any

import anyio
from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from gateway.http.errors import error_body, to_domain_error
from shared.jobs.streams import StreamEvent
from shared.protocol import TokenEvent

DONE = "[DONE]"
SEPARATOR = "\n"
# Proxies commonly drop connections idle for 30-60 s; a comment every 15 s keeps them open.
KEEPALIVE_S = 15.0
# A reader that takes no bytes for this long is treated as gone (and its job aborted).
SEND_TIMEOUT_S = 30.0
# The default of GatewaySettings.drain_grace_s, for callers without settings at hand.
DRAIN_GRACE_S = 30.0

ChunkMaker = Callable[[TokenEvent], Sequence[BaseModel]]
OnClose = Callable[[], Awaitable[None]]
FrameMaker = Callable[[StreamEvent], Iterable[ServerSentEvent]]
# What a relay hands over: one event, or every event that had arrived (written as one send).
Relayed = StreamEvent | list[StreamEvent]


def event_stream(
    first: StreamEvent | None,
    rest: AsyncGenerator[Relayed, None],
    to_chunks: ChunkMaker,
    *,
    drain_grace_s: float = DRAIN_GRACE_S,
    on_close: OnClose | None = None,
) -> EventSourceResponse:
    """A streaming response relaying ``first`` then ``rest`` as chunks, ending with ``[DONE]``.

    When the server stops, the stream may run on for ``drain_grace_s`` before it is
    cut (and then its job keeps running, for a resume elsewhere: ``gateway/http/shutdown.py``).
    ``on_close`` runs once the response is over, however it ended (its stream slot is given back).
    """
    frames = relayed_frames(
        first,
        rest,
        lambda item: _event_frames(item, to_chunks),
        _error_frame,
        done=ServerSentEvent(data=DONE, sep=SEPARATOR),
    )
    return sse_response(frames, drain_grace_s=drain_grace_s, on_close=on_close)


def sse_response(
    frames: AsyncIterator[ServerSentEvent | bytes],
    *,
    drain_grace_s: float | None = None,
    on_close: OnClose | None = None,
) -> EventSourceResponse:
    """``frames`` as an SSE response: keep-alives, the send timeout, and a drain once the server
    stops when ``drain_grace_s`` is given (without it, sse-starlette's defaults); ``on_close``
    runs once the response is over."""
    return _ClosingEventSourceResponse(
        frames,
        on_close=on_close,
        sep=SEPARATOR,
        ping=KEEPALIVE_S,
        ping_message_factory=_keepalive,
        send_timeout=SEND_TIMEOUT_S,
        shutdown_event=None if drain_grace_s is None else anyio.Event(),
        shutdown_grace_period=0 if drain_grace_s is None else drain_grace_s,
    )


class _ClosingEventSourceResponse(EventSourceResponse):
    """An SSE response that runs ``on_close`` when it is over: finished, failed or cut off.

    Here rather than in the frames' generator: a generator never started (its client
    left before the first frame) never runs its ``finally``; the response always returns.
    """

    def __init__(self, *args: Any, on_close: OnClose | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                await self._on_close()


async def relayed_frames(
    first: StreamEvent | None,
    rest: AsyncGenerator[Relayed, None],
    to_frames: FrameMaker,
    error_frame: Callable[[Exception], ServerSentEvent],
    *,
    done: ServerSentEvent | None = None,
) -> AsyncIterator[ServerSentEvent | bytes]:
    """The frames of ``first`` then of each event of ``rest``, then ``done`` (if any).

    The frames of a batch of events go out encoded together, as one send: each send costs
    the relay more than a frame does. A failure while relaying ``rest`` ends the stream with
    ``error_frame`` instead of ``done``, after the frames of a batch made before it.
    """
    async with aclosing(rest):
        for frame in to_frames(first) if first is not None else ():
            yield frame
        try:
            async for item in rest:
                if isinstance(item, StreamEvent):
                    for frame in to_frames(item):
                        yield frame
                    continue
                encoded, failure = _encoded_frames(item, to_frames)
                if encoded:
                    yield encoded
                if failure is not None:
                    raise failure
        except Exception as exc:  # after the 200 went out, failures travel in-band
            yield error_frame(exc)
            return
    if done is not None:
        yield done


def _encoded_frames(batch: list[StreamEvent], to_frames: FrameMaker) -> tuple[bytes, Exception | None]:
    """The frames of ``batch`` encoded back to back, and the failure that cut them short, if any."""
    encoded = bytearray()
    try:
        for item in batch:
            for frame in to_frames(item):
                encoded += frame.encode()
    except Exception as exc:
        return bytes(encoded), exc
    return bytes(encoded), None


def _event_frames(item: StreamEvent, to_chunks: ChunkMaker) -> list[ServerSentEvent]:
    chunks = to_chunks(item.event)
    return [
        ServerSentEvent(
            data=chunk.model_dump_json(),
            id=item.entry_id if position == len(chunks) - 1 else None,
            sep=SEPARATOR,
        )
        for position, chunk in enumerate(chunks)
    ]


def _error_frame(exc: Exception) -> ServerSentEvent:
    return ServerSentEvent(data=error_body(to_domain_error(exc)).model_dump_json(), sep=SEPARATOR)


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keepalive", sep=SEPARATOR)
