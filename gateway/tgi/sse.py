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

from collections.abc import AsyncGenerator

from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent

from gateway.http.errors import to_domain_error
from gateway.http.sse import SEPARATOR, OnClose, relayed_frames, sse_response
from gateway.tgi.translate import TgiStream, tgi_error
from shared.jobs.streams import StreamEvent


def token_stream(
    first: StreamEvent,
    rest: AsyncGenerator[StreamEvent, None],
    stream: TgiStream,
    on_close: OnClose | None = None,
) -> EventSourceResponse:
    """A streaming response relaying ``first`` then ``rest`` as TGI token events; ``on_close``
    runs once it is over."""
    frames = relayed_frames(
        first,
        rest,
        lambda item: [_frame(response) for response in stream.feed(item.event)],
        lambda exc: _frame(tgi_error(to_domain_error(exc))[1]),
    )
    return sse_response(frames, on_close=on_close)


def _frame(payload: BaseModel) -> ServerSentEvent:
    return ServerSentEvent(data=payload.model_dump_json(), sep=SEPARATOR)
