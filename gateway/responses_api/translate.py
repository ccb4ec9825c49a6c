"""Owns the pure conversions of the Responses API: request -> job, events -> response and stream events.

A response is a chat job: ``instructions`` becomes a system message before the
input's messages (a string input is one user message); ``max_output_tokens``
is ``max_tokens``. Its events fold into one assistant message; a ``length``
finish makes the response ``incomplete`` (reason ``max_output_tokens``), as
OpenAI reports it. No I/O and no clock here: ids and times come in as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from gateway.responses_api.schema import (
    ContentPartEvent,
    IncompleteDetails,
    InputMessage,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    Response,
    ResponseCreateRequest,
    ResponseError,
    ResponseLifecycleEvent,
    ResponseUsage,
    TextDeltaEvent,
    TextDoneEvent,
)
from shared.errors import InvalidRequest
from shared.protocol import (
    Accepted,
    ChatMessage,
    ChatPrompt,
    Delta,
    Failed,
    Finished,
    FinishReason,
    GenerationJob,
    SamplingSpec,
    TokenEvent,
)

RESPONSE_ID_PREFIX = "resp_"
MESSAGE_ID_PREFIX = "msg_"
_ROLES = {"developer": "system"}


def response_job(request: ResponseCreateRequest, request_id: str, created_at: float) -> GenerationJob:
    """The chat job answering ``request``; tools and conversation state are refused."""
    if request.tools:
        raise InvalidRequest("Tools are not supported by this server.", param="tools")
    if request.previous_response_id:
        raise InvalidRequest(
            "previous_response_id is not supported; send the messages.", param="previous_response_id"
        )
    sampling = SamplingSpec(
        max_tokens=request.max_output_tokens, temperature=request.temperature, top_p=request.top_p
    )
    return GenerationJob(
        request_id=request_id,
        model=request.model,
        prompt=ChatPrompt(messages=_messages(request)),
        sampling=sampling,
        created_at=created_at,
    )


def _messages(request: ResponseCreateRequest) -> list[ChatMessage]:
    messages = [ChatMessage(role="system", content=request.instructions)] if request.instructions else []
    return messages + [_message(item) for item in request.input]


def _message(item: InputMessage) -> ChatMessage:
    content = "\n".join(part.text for part in item.content)
    return ChatMessage(role=_ROLES.get(item.role, item.role), content=content)


def response_id(request_id: str) -> str:
    return RESPONSE_ID_PREFIX + request_id


def message_id(request_id: str) -> str:
    return MESSAGE_ID_PREFIX + request_id


def pending_response(
    request: ResponseCreateRequest, request_id: str, created_at: float, status: str = "queued"
) -> Response:
    """The response before any output: what ``background`` answers at once, and a stream's first event."""
    return Response(
        id=response_id(request_id),
        created_at=created_at,
        status=status,
        background=bool(request.background),
        model=request.model,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        metadata=request.metadata,
    )


def as_created(stored: Response) -> Response:
    """The response ``stored`` was when it was created (``pending_response``): a replayed stream
    starts from it, as the first one did."""
    return stored.model_copy(
        update={
            "status": "queued",
            "output": [],
            "error": None,
            "incomplete_details": None,
            "usage": None,
            "completed_at": None,
        }
    )


def finished_response(
    pending: Response, events: Sequence[TokenEvent], request_id: str, now: float
) -> Response:
    """``pending`` completed (or failed, or incomplete) with the job's events."""
    failure = next((event for event in events if isinstance(event, Failed)), None)
    if failure is not None:
        error = ResponseError(code=failure.error.code or "server_error", message=failure.error.message)
        return pending.model_copy(update={"status": "failed", "error": error, "completed_at": now})
    finished = next((event for event in events if isinstance(event, Finished)), None)
    if finished is None:
        raise ValueError("the events have no terminal event")
    text = "".join(event.text for event in events if isinstance(event, Delta) and event.index == 0)
    is_cut = finished.finish_reason is FinishReason.LENGTH
    return pending.model_copy(
        update={
            "status": "incomplete" if is_cut else "completed",
            "output": [_message_item(request_id, text, "incomplete" if is_cut else "completed")],
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if is_cut else None,
            "usage": _usage(finished),
            "completed_at": now,
        }
    )


def _message_item(request_id: str, text: str, status: str) -> OutputMessage:
    return OutputMessage(
        id=message_id(request_id),
        status=status,
        content=[OutputText(text=text)] if text or status != "in_progress" else [],
    )


def _usage(finished: Finished) -> ResponseUsage:
    prompt, completion = finished.usage.prompt_tokens, finished.usage.completion_tokens
    return ResponseUsage(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion)


class ResponseStream:
    """Turns one response's token events into Responses API stream events, numbered in order.

    ``starting_after`` replays a stream picked up again: the events up to that number are
    made (numbering depends only on the token events) but not returned.
    """

    def __init__(self, pending: Response, request_id: str, now: float, starting_after: int = -1) -> None:
        self._pending = pending
        self._request_id = request_id
        self._item_id = message_id(request_id)
        self._now = now
        self._texts: list[str] = []
        self._sequence = 0
        self._starting_after = starting_after

    def events(self, event: TokenEvent) -> list[BaseModel]:
        first = self._sequence  # the number of this call's first event
        made = self._made(event)
        return made[max(0, self._starting_after + 1 - first) :]

    def _made(self, event: TokenEvent) -> list[BaseModel]:
        if isinstance(event, Accepted):
            return self._opening()
        if isinstance(event, Delta) and event.index == 0 and event.text:
            self._texts.append(event.text)
            return [TextDeltaEvent(sequence_number=self._next(), item_id=self._item_id, delta=event.text)]
        if isinstance(event, Finished):
            return self._closing(event)
        return []

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    def _opening(self) -> list[BaseModel]:
        running = self._pending.model_copy(update={"status": "in_progress"})
        item = _message_item(self._request_id, "", "in_progress")
        return [
            ResponseLifecycleEvent(type="response.created", sequence_number=self._next(), response=running),
            ResponseLifecycleEvent(
                type="response.in_progress", sequence_number=self._next(), response=running
            ),
            OutputItemEvent(type="response.output_item.added", sequence_number=self._next(), item=item),
            self._part("response.content_part.added", ""),
        ]

    def _closing(self, event: Finished) -> list[BaseModel]:
        text = "".join(self._texts)
        final = finished_response(
            self._pending, [event.model_copy(), *self._deltas()], self._request_id, self._now
        )
        done_type = "response.incomplete" if final.status == "incomplete" else "response.completed"
        return [
            TextDoneEvent(sequence_number=self._next(), item_id=self._item_id, text=text),
            self._part("response.content_part.done", text),
            OutputItemEvent(
                type="response.output_item.done", sequence_number=self._next(), item=final.output[0]
            ),
            ResponseLifecycleEvent(type=done_type, sequence_number=self._next(), response=final),
        ]

    def _deltas(self) -> list[TokenEvent]:
        return [Delta(text="".join(self._texts), token_ids=[])]

    def _part(self, kind: str, text: str) -> ContentPartEvent:
        return ContentPartEvent(
            type=kind,
            sequence_number=self._next(),
            item_id=self._item_id,
            part=OutputText(text=text),
        )
