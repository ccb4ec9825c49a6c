"""Batch input validation, line -> jobs, events -> output lines; the CLI's progress line."""

from __future__ import annotations

import json

import pytest

from cli.batch import progress_line
from gateway.batches.input_check import FileCheck, InvalidBatchFile, lines_in
from gateway.batches.lines import LineRules, ParsedLine, expired_line, line_jobs, output_line
from shared.errors import ContextLengthExceeded
from shared.protocol import Accepted, ChoiceFinished, Delta, Failed, Finished, FinishReason, Usage

CHAT = "/v1/chat/completions"
RULES = LineRules(CHAT, max_n=16, max_tokens_limit=None)


def parse_input(content: bytes, endpoint: str, max_tokens_limit: int | None) -> list[ParsedLine]:
    """A whole file checked in one chunk, then every line read back as a running batch reads it."""
    rules = LineRules(endpoint, max_n=16, max_tokens_limit=max_tokens_limit)
    check = FileCheck(rules)
    check.feed(content, 0)
    index, _ = check.finish()
    start, end = index.span(0, len(index))
    parsed = lines_in(content[start:end], index.numbers(0, len(index)), rules)
    assert all(isinstance(line, ParsedLine) for line in parsed)
    return parsed  # type: ignore[return-value]


def line(custom_id: str, **body: object) -> bytes:
    request = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": request}).encode()


def test_valid_file_parses_every_line_and_skips_blank_ones() -> None:
    lines = parse_input(b"\n".join([line("a"), b"", line("b", max_tokens=3)]), CHAT, None)
    assert [(parsed.number, parsed.custom_id) for parsed in lines] == [(1, "a"), (3, "b")]


def test_each_bad_line_is_named_with_its_number() -> None:
    content = b"\n".join(
        [
            line("a"),
            b"{broken",
            line("a"),
            line("c", stream=True),
            line("d", max_tokens=500),
            json.dumps({"custom_id": "e", "method": "GET", "url": CHAT, "body": {}}).encode(),
            line("f", model="other"),
        ]
    )
    with pytest.raises(InvalidBatchFile) as raised:
        parse_input(content, CHAT, max_tokens_limit=100)
    by_line = {error.line: error for error in raised.value.errors}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7]
    assert "Duplicate custom_id" in str(by_line[3].message)
    assert by_line[4].param == "body.stream"
    assert by_line[5].param == "max_tokens"
    assert by_line[7].code == "mismatched_model"


def test_url_other_than_the_batch_endpoint_is_refused() -> None:
    with pytest.raises(InvalidBatchFile) as raised:
        parse_input(line("a"), "/v1/completions", None)
    assert raised.value.errors[0].param == "url"


def test_empty_file_is_refused() -> None:
    with pytest.raises(InvalidBatchFile):
        parse_input(b"\n\n", CHAT, None)


def finished_events(text: str) -> list[object]:
    return [
        Accepted(prompt_tokens=3, worker_id="w"),
        Delta(text=text, token_ids=[1, 2]),
        ChoiceFinished(index=0, finish_reason=FinishReason.STOP, completion_tokens=2),
        Finished(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=3, completion_tokens=2)),
    ]


def test_finished_line_becomes_a_chat_completion_output_line() -> None:
    [parsed] = parse_input(line("a"), CHAT, None)
    [job] = line_jobs(parsed, "rid", 1.0, RULES)
    assert job.request_id == "rid"
    output, failed = output_line(parsed, "batch_req_rid", "rid", 1.0, [finished_events("Hello")])  # type: ignore[list-item]
    assert not failed
    assert output.custom_id == "a" and output.error is None and output.response is not None
    assert output.response.status_code == 200
    assert output.response.body["choices"][0]["message"]["content"] == "Hello"
    assert output.response.body["usage"]["total_tokens"] == 5


def test_failed_line_carries_the_openai_error_body_and_status() -> None:
    [parsed] = parse_input(line("a"), CHAT, None)
    events = [Failed(error=ContextLengthExceeded("too long", param="messages").to_info())]
    output, failed = output_line(parsed, "batch_req_rid", "rid", 1.0, [events])
    assert failed and output.response is not None and output.response.status_code == 400
    assert output.response.body == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def test_expired_line_has_no_response_and_a_batch_expired_error() -> None:
    [parsed] = parse_input(line("a"), CHAT, None)
    expired = expired_line(parsed.custom_id, "batch_req_x")
    assert expired.response is None and expired.error is not None and expired.error.code == "batch_expired"


def test_progress_line_shows_done_total_rate_and_eta() -> None:
    assert progress_line(10, 40, 5.0) == f"[{'#' * 7}{'-' * 23}] 10/40 lines  2.0 lines/s  ETA 15s"
    assert progress_line(0, 0, 0.0).endswith("0/0 lines  0.0 lines/s  ETA ?")
