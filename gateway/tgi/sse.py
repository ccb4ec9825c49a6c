"""Owns the SSE framing of TGI's /generate_stream: one ``data:`` event per token, no ``[DONE]``.

TGI ends its stream after the event carrying ``generated_text``; TGI's own Python
client parses every ``data:`` line as JSON, so an OpenAI-style ``[DONE]`` would break
it. A failure after the 200 went out travels in-band in TGI's error shape
(``data: {"error": ..., "error_type": ...}``), which ``huggingface_hub`` raises.
Keep-alive comments, the send timeout and line endings are those of ``gateway/http/sse.py``.

Intentional divergence from our OpenAI streams: frames carry no SSE ``id:``. Each
token is held back until the next event (see ``gateway/tgi/translate.py``), so an
id would not name the point a client has really received; TGI sends none either.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent

from gateway.http.errors import to_domain_error
from gateway.http.sse import KEEPALIVE_S, SEND_TIMEOUT_S, SEPARATOR
from gateway.tgi.translate import TgiStream, tgi_error
from shared.jobs.streams import StreamEvent


def token_stream(
    first: StreamEvent, rest: AsyncGenerator[StreamEvent, None], stream: TgiStream
) -> EventSourceResponse:
    """A streaming response relaying ``first`` then ``rest`` as TGI token events."""
    return EventSourceResponse(
        _frames(first, rest, stream),
        sep=SEPARATOR,
        ping=KEEPALIVE_S,
        ping_message_factory=_keepalive,
        send_timeout=SEND_TIMEOUT_S,
    )


async def _frames(
    first: StreamEvent, rest: AsyncGenerator[StreamEvent, None], stream: TgiStream
) -> AsyncIterator[ServerSentEvent]:
    async with aclosing(rest):
        for response in stream.feed(first.event):
            yield _frame(response)
        try:
            async for item in rest:
                for response in stream.feed(item.event):
                    yield _frame(response)
        except Exception as exc:  # after the 200 went out, failures travel in-band
            yield _frame(tgi_error(to_domain_error(exc))[1])


def _frame(payload: BaseModel) -> ServerSentEvent:
    return ServerSentEvent(data=payload.model_dump_json(), sep=SEPARATOR)


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keepalive", sep=SEPARATOR)
