"""Owns rendering a response's token events: the finished response, and its numbered stream events.

Its events fold into output items (``gateway/responses_api/output.py``); a
``length`` finish makes the response ``incomplete`` (reason ``max_output_tokens``),
as OpenAI reports it; a tool-call finish is ``completed`` (the calls are its
output). No I/O and no clock: ids and times come in as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from gateway.responses_api.events import ResponseLifecycleEvent
from gateway.responses_api.objects import (
    IncompleteDetails,
    OutputItem,
    OutputTokensDetails,
    Response,
    ResponseError,
    ResponseUsage,
)
from gateway.responses_api.output import OutputBuilder, output_items
from shared.protocol import Accepted, Delta, Failed, Finished, FinishReason, TokenEvent


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
    deltas = [event for event in events if isinstance(event, Delta) and event.index == 0]
    return _ended(pending, output_items(request_id, deltas, _is_cut(finished)), finished, now)


def _ended(pending: Response, output: list[OutputItem], finished: Finished, now: float) -> Response:
    is_cut = _is_cut(finished)
    return pending.model_copy(
        update={
            "status": "incomplete" if is_cut else "completed",
            "output": output,
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if is_cut else None,
            "usage": _usage(finished),
            "completed_at": now,
        }
    )


def _is_cut(finished: Finished) -> bool:
    return finished.finish_reason is FinishReason.LENGTH


def _usage(finished: Finished) -> ResponseUsage:
    prompt, completion = finished.usage.prompt_tokens, finished.usage.completion_tokens
    return ResponseUsage(
        input_tokens=prompt,
        output_tokens=completion,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=finished.usage.reasoning_tokens),
        total_tokens=prompt + completion,
    )


class ResponseStream:
    """Turns one response's token events into Responses API stream events, numbered in order.

    ``starting_after`` replays a stream picked up again: the events up to that number are
    made (numbering depends only on the token events) but not returned.
    """

    def __init__(self, pending: Response, request_id: str, now: float, starting_after: int = -1) -> None:
        self._pending = pending
        self._now = now
        self._sequence = 0
        self._starting_after = starting_after
        self._output = OutputBuilder(request_id, self._next)

    def events(self, event: TokenEvent) -> list[BaseModel]:
        first = self._sequence  # the number of this call's first event
        made = self._made(event)
        return made[max(0, self._starting_after + 1 - first) :]

    def _made(self, event: TokenEvent) -> list[BaseModel]:
        if isinstance(event, Accepted):
            running = self._pending.model_copy(update={"status": "in_progress"})
            return [
                self._lifecycle("response.created", running),
                self._lifecycle("response.in_progress", running),
            ]
        if isinstance(event, Delta) and event.index == 0:
            return self._output.add(event)
        if isinstance(event, Finished):
            is_cut = _is_cut(event)
            closing = self._output.finish(is_cut)
            final = _ended(self._pending, self._output.output(is_cut), event, self._now)
            done = "response.incomplete" if is_cut else "response.completed"
            return [*closing, self._lifecycle(done, final)]
        return []

    def _lifecycle(self, kind: str, response: Response) -> ResponseLifecycleEvent:
        return ResponseLifecycleEvent(type=kind, sequence_number=self._next(), response=response)

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence - 1
