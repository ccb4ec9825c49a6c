"""Owns the pure side of batch lines: validating an input file, line -> jobs, events -> output line.

A file is validated whole before any line runs, as OpenAI does: every line must be
JSON with a unique ``custom_id``, ``method`` POST, the batch's ``url`` and a
``body`` that is a valid request for it (the same request models and translation
as the interactive routes, so a line is refused exactly when the request would
be), naming one model for the whole batch. Problems are collected per line
(``BatchError.line`` is 1-based) instead of stopping at the first.

Intentional divergence: batch lines are capped by ``max_tokens_limit`` like any
request, but not charged to the key's tokens-per-minute bucket. A batch is work
accepted for later (OpenAI gives batches their own queue limits, not the
per-minute ones); charging thousands of lines at once would refuse any real batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from gateway.access.quota import capped
from gateway.batches.schema import BatchError, BatchInputLine, BatchOutputLine, LineError, LineResponse
from gateway.http.errors import error_body, validation_error
from gateway.openai import render, translate
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from shared.errors import InvalidRequest, TokenferryError, error_from_info
from shared.protocol import Failed, GenerationJob, TokenEvent

# Past this many, the rest of a broken file's problems are not listed one by one.
MAX_REPORTED_ERRORS = 100
LINE_ID_PREFIX = "batch_req_"

LineRequest = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True, slots=True)
class ParsedLine:
    number: int  # 1-based line of the input file
    custom_id: str
    request: LineRequest


class InvalidBatchFile(Exception):
    """The input file cannot run; ``errors`` name each bad line."""

    def __init__(self, errors: list[BatchError]) -> None:
        super().__init__(f"{len(errors)} problem(s) in the input file")
        self.errors = errors


def parse_input(content: bytes, endpoint: str, max_tokens_limit: int | None) -> list[ParsedLine]:
    """Every line of ``content`` validated for ``endpoint``; raises ``InvalidBatchFile`` listing problems."""
    lines: list[ParsedLine] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = _parse_line(number, raw, endpoint, max_tokens_limit)
            if line.custom_id in seen:
                raise InvalidRequest(f"Duplicate custom_id '{line.custom_id}'.", param="custom_id")
            seen.add(line.custom_id)
            lines.append(line)
        except TokenferryError as error:
            errors.append(
                BatchError(code="invalid_request", message=error.message, param=error.param, line=number)
            )
    errors += _model_errors(lines)
    if not lines and not errors:
        errors.append(BatchError(code="empty_file", message="The input file has no lines."))
    if errors:
        raise InvalidBatchFile(errors[:MAX_REPORTED_ERRORS])
    return lines


def _parse_line(number: int, raw: bytes, endpoint: str, max_tokens_limit: int | None) -> ParsedLine:
    try:
        line = BatchInputLine.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as error:
        raise _line_problem(error) from error
    if line.url != endpoint:
        raise InvalidRequest(f"The url '{line.url}' is not the batch's endpoint '{endpoint}'.", param="url")
    model = ChatCompletionRequest if endpoint == "/v1/chat/completions" else CompletionRequest
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
    for job in line_jobs(parsed, "validation", 0.0):  # translation refuses what the routes refuse
        capped(job, max_tokens_limit)
    return parsed


def _line_problem(error: ValueError | ValidationError) -> InvalidRequest:
    if isinstance(error, ValidationError):
        return validation_error(error.errors())
    return InvalidRequest(f"The line is not valid JSON: {error}.")


def _model_errors(lines: Sequence[ParsedLine]) -> list[BatchError]:
    """One model per batch, like OpenAI: the lines run on that model's batch queue."""
    first = lines[0].request.model if lines else None
    return [
        BatchError(
            code="mismatched_model",
            message=f"Every line must use the same model; line {lines[0].number} uses '{first}'.",
            param="body.model",
            line=line.number,
        )
        for line in lines
        if line.request.model != first
    ]


def line_jobs(line: ParsedLine, request_id: str, created_at: float) -> list[GenerationJob]:
    """The jobs of one line: one, or one per prompt of a completions line listing several."""
    if isinstance(line.request, ChatCompletionRequest):
        return [translate.chat_job(line.request, request_id, created_at)]
    return translate.completion_jobs(line.request, request_id, created_at)


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
        error = error_from_info(failure.error)
        body = error_body(error).model_dump()
        return _line(
            line, line_id, LineResponse(status_code=error.status, request_id=request_id, body=body)
        ), True
    response = LineResponse(
        status_code=200, request_id=request_id, body=_response_body(line, request_id, created_at, results)
    )
    return _line(line, line_id, response), False


def _response_body(
    line: ParsedLine, request_id: str, created_at: float, results: Sequence[Sequence[TokenEvent]]
) -> dict[str, object]:
    if isinstance(line.request, ChatCompletionRequest):
        meta = translate.chat_meta(line.request, request_id, created_at)
        return render.chat_completion(meta, results[0]).model_dump(mode="json")
    meta = translate.completion_meta(line.request, request_id, created_at)
    return render.text_completion(meta, results).model_dump(mode="json")


def expired_line(line: ParsedLine, line_id: str) -> BatchOutputLine:
    """The error line of a line the batch's window closed on before it ran."""
    error = LineError(
        code="batch_expired",
        message="This request could not be executed before the completion window expired.",
    )
    return BatchOutputLine(id=line_id, custom_id=line.custom_id, response=None, error=error)


def _line(line: ParsedLine, line_id: str, response: LineResponse) -> BatchOutputLine:
    return BatchOutputLine(id=line_id, custom_id=line.custom_id, response=response, error=None)
