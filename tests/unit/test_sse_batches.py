"""A batch of relayed events goes out as one write holding each event's frames, ids included."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

from pydantic import BaseModel
from sse_starlette import ServerSentEvent

from gateway.http.sse import Relayed, relayed_frames
from shared.jobs.streams import StreamEvent
from shared.protocol import Delta, TokenEvent


class Chunk(BaseModel):
    text: str


def _chunks(event: TokenEvent) -> Sequence[BaseModel]:
    assert isinstance(event, Delta)
    if event.text == "boom":
        raise ValueError("cannot render")
    return [Chunk(text=event.text)]


def _frames(item: StreamEvent) -> list[ServerSentEvent]:
    return [
        ServerSentEvent(data=chunk.model_dump_json(), id=item.entry_id, sep="\n")
        for chunk in _chunks(item.event)
    ]


def _error(exc: Exception) -> ServerSentEvent:
    return ServerSentEvent(data=f"error: {exc}", sep="\n")


def _event(entry_id: str, text: str) -> StreamEvent:
    return StreamEvent(entry_id, Delta(text=text, token_ids=[1]))


async def _relayed(*items: Relayed) -> AsyncGenerator[Relayed, None]:
    for item in items:
        yield item


async def _sent(*items: Relayed) -> list[bytes]:
    frames = relayed_frames(
        None, _relayed(*items), _frames, _error, done=ServerSentEvent(data="[DONE]", sep="\n")
    )
    return [frame if isinstance(frame, bytes) else frame.encode() async for frame in frames]


async def test_a_batch_is_one_write_of_every_frame_in_order() -> None:
    sent = await _sent(_event("1-0", "a"), [_event("2-0", "b"), _event("2-1", "c")])

    assert sent == [
        b'id: 1-0\ndata: {"text":"a"}\n\n',
        b'id: 2-0\ndata: {"text":"b"}\n\nid: 2-1\ndata: {"text":"c"}\n\n',
        b"data: [DONE]\n\n",
    ]


async def test_a_failure_inside_a_batch_sends_the_frames_before_it_then_the_error() -> None:
    sent = await _sent([_event("1-0", "a"), _event("1-1", "boom"), _event("1-2", "c")])

    assert sent == [b'id: 1-0\ndata: {"text":"a"}\n\n', b"data: error: cannot render\n\n"]
