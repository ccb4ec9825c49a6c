"""Owns the pure side of one batch line: line -> checked request -> jobs, events -> output line.

A line must be JSON with a ``custom_id``, ``method`` POST, the batch's ``url`` and
a ``body`` that is a valid request for it. The body goes through exactly what an
interactive request goes through: the same request models, then
``translate.request_jobs`` (the operator's caps, such as ``max_n``) and the quota's
``capped`` (``max_tokens_limit``), so a line is refused exactly when the request
would be, with the same message and ``param`` (the model's own problems are named
``body.<field>``). Checking a line is pure, so it fails the same way every time:
even an unexpected exception is the line's problem (``InvalidRequest`` on
``body``), never a reason to try the batch again. A whole file is checked by
``gateway/batches/input_check.py``.

Intentional divergence: batch lines are capped by ``max_tokens_limit`` like any
request, but not charged to the key's tokens-per-minute bucket. A batch is work
accepted for later (OpenAI gives batches their own queue limits, not the
per-minute ones); charging thousands of lines at once would refuse any real batch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from gateway.access.quota import capped
from gateway.batches.schema import BatchInputLine, BatchOutputLine, LineError, LineResponse
from gateway.http.errors import error_body, validation_error
from gateway.openai import render, translate
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from shared.errors import InvalidRequest, TokenferryError, error_from_info
from shared.protocol import Failed, GenerationJob, TokenEvent

logger = logging.getLogger(__name__)

LINE_ID_PREFIX = "batch_req_"

LineRequest = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True, slots=True)
class LineRules:
    """What every line of one batch is checked against: its endpoint and the operator's caps."""

    endpoint: str
    max_n: int
    max_tokens_limit: int | None


@dataclass(frozen=True, slots=True)
class ParsedLine:
    number: int  # 1-based line of the input file
    custom_id: str
    request: LineRequest


def checked_line(number: int, raw: bytes, rules: LineRules) -> ParsedLine:
    """Line ``number`` of an input file as a request that may run; ``InvalidRequest`` otherwise."""
    try:
        return _checked_line(number, raw, rules)
    except TokenferryError:
        raise
    except Exception as error:
        # Pure checks of one line: it fails this way on every try, so it is the line's error, and
        # the client gets no internal text (the log keeps it).
        logger.warning("batch line %d failed its checks unexpectedly: %r", number, error)
        raise InvalidRequest("The line's body is not a valid request.", param="body") from error


def envelope(raw: bytes, endpoint: str) -> BatchInputLine:
    """The line around the request: ``custom_id``, ``method``, ``url`` (the batch's) and ``body``."""
    try:
        line = BatchInputLine.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as error:
        raise _line_problem(error) from error
    if line.url != endpoint:
        raise InvalidRequest(f"The url '{line.url}' is not the batch's endpoint '{endpoint}'.", param="url")
    return line


def _checked_line(number: int, raw: bytes, rules: LineRules) -> ParsedLine:
    line = envelope(raw, rules.endpoint)
    model = ChatCompletionRequest if rules.endpoint == "/v1/chat/completions" else CompletionRequest
    try:
        request: LineRequest = model.model_validate(line.body)
    except ValidationError as error:
        problem = validation_error(error.errors())
        raise InvalidRequest(
            problem.message, param=f"body.{problem.param}" if problem.param else "body"
        ) from error
    if request.stream:
        raise InvalidRequest("Batch lines cannot stream; leave stream unset.", param="body.stream")
    parsed = ParsedLine(number, line.custom_id, request)
    line_jobs(parsed, "validation", 0.0, rules)  # refuses what the routes refuse
    return parsed


def _line_problem(error: ValueError | ValidationError) -> InvalidRequest:
    if isinstance(error, ValidationError):
        return validation_error(error.errors())
    return InvalidRequest(f"The line is not valid JSON: {error}.")


def line_jobs(line: ParsedLine, request_id: str, created_at: float, rules: LineRules) -> list[GenerationJob]:
    """The jobs of one line as they may run: one, or one per prompt of a completions line listing several."""
    jobs = translate.request_jobs(line.request, request_id, created_at, rules.max_n)
    return [capped(job, rules.max_tokens_limit) for job in jobs]


def output_line(
    line: ParsedLine,
    line_id: str,
    request_id: str,
    created_at: float,
    results: Sequence[Sequence[TokenEvent]],
) -> tuple[BatchOutputLine, bool]:
    """The output line of a finished line (its jobs' events, in job order); True when it failed."""
    failure = next((event for events in results for event in events if isinstance(event, Failed)), None)
    if failure is not None:
        return error_line(line.custom_id, line_id, request_id, error_from_info(failure.error)), True
    response = LineResponse(
        status_code=200, request_id=request_id, body=_response_body(line, request_id, created_at, results)
    )
    return BatchOutputLine(id=line_id, custom_id=line.custom_id, response=response, error=None), False


def _response_body(
    line: ParsedLine, request_id: str, created_at: float, results: Sequence[Sequence[TokenEvent]]
) -> dict[str, object]:
    if isinstance(line.request, ChatCompletionRequest):
        meta = translate.chat_meta(line.request, request_id, created_at)
        return render.chat_completion(meta, results[0]).model_dump(mode="json")
    meta = translate.completion_meta(line.request, request_id, created_at)
    return render.text_completion(meta, results).model_dump(mode="json")


def expired_line(custom_id: str, line_id: str) -> BatchOutputLine:
    """The error line of a line the batch's window closed on before it ran."""
    error = LineError(
        code="batch_expired",
        message="This request could not be executed before the completion window expired.",
    )
    return BatchOutputLine(id=line_id, custom_id=custom_id, response=None, error=error)


def error_line(custom_id: str, line_id: str, request_id: str, error: TokenferryError) -> BatchOutputLine:
    """The line of a request that failed with ``error``: its OpenAI error body and status."""
    response = LineResponse(
        status_code=error.status, request_id=request_id, body=error_body(error).model_dump()
    )
    return BatchOutputLine(id=line_id, custom_id=custom_id, response=response, error=None)
