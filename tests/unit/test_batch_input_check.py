"""Checking a batch input file chunk by chunk: the same answer whatever the chunks, the routes' caps."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.batches.input_check import (
    MAX_REPORTED_ERRORS,
    FileCheck,
    InvalidBatchFile,
    custom_ids_in,
    lines_in,
)
from gateway.batches.lines import LineRules, ParsedLine, checked_line
from gateway.openai import translate
from gateway.openai.schema import CompletionRequest
from shared.errors import InvalidRequest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RULES = LineRules(CHAT, max_n=16, max_tokens_limit=None)


def line(custom_id: str, **body: object) -> bytes:
    request = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": request}).encode()


def checked(chunks: list[bytes], rules: LineRules = RULES) -> FileCheck:
    check, offset = FileCheck(rules), 0
    for chunk in chunks:
        check.feed(chunk, offset)
        offset += len(chunk)
    return check


def whole_lines(content: bytes, cuts: list[int]) -> list[bytes]:
    """``content`` cut after the newlines at ``cuts`` (indexes into its newlines), as a reader cuts it."""
    newlines = [position + 1 for position, byte in enumerate(content) if byte == ord("\n")]
    ends = (
        sorted({newlines[cut % len(newlines)] for cut in cuts} | {len(content)})
        if newlines
        else [len(content)]
    )
    starts = [0, *ends[:-1]]
    return [content[start:end] for start, end in zip(starts, ends, strict=True)]


@given(
    shape=st.lists(st.sampled_from(["line", "blank", "crlf"]), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=50), max_size=6),
)
def test_any_chunking_gives_the_same_index_and_lines(shape: list[str], cuts: list[int]) -> None:
    rows = [
        b"" if kind == "blank" else line(f"c{i}") + (b"\r" if kind == "crlf" else b"")
        for i, kind in enumerate(shape)
    ]
    content = b"\n".join(rows) + b"\n"
    expected = [(number, f"c{number - 1}") for number, kind in enumerate(shape, start=1) if kind != "blank"]
    if not expected:
        with pytest.raises(InvalidBatchFile):
            checked(whole_lines(content, cuts)).finish()
        return

    index, model = checked(whole_lines(content, cuts)).finish()

    assert model == "m" and len(index) == len(expected)
    for first in range(len(index)):  # each line read back alone, as a runner taking over reads it
        start, end = index.span(first, 1)
        [parsed] = lines_in(content[start:end], index.numbers(first, 1), RULES)
        assert isinstance(parsed, ParsedLine) and (parsed.number, parsed.custom_id) == expected[first]
    start, end = index.span(0, len(index))
    assert custom_ids_in(content[start:end], CHAT) == [custom_id for _, custom_id in expected]


def test_a_line_asking_more_choices_than_max_n_is_refused_as_the_route_refuses_it() -> None:
    body = {"model": "m", "prompt": ["a", "b", "c", "d"], "n": 100}
    raw = json.dumps({"custom_id": "x", "method": "POST", "url": COMPLETIONS, "body": body}).encode()
    with pytest.raises(InvalidRequest) as route:
        translate.request_jobs(CompletionRequest.model_validate(body), "r", 0.0, max_n=16)

    with pytest.raises(InvalidRequest) as batch:
        checked_line(1, raw, LineRules(COMPLETIONS, max_n=16, max_tokens_limit=None))

    assert (batch.value.message, batch.value.param) == (route.value.message, route.value.param)
    assert route.value.param == "n"


def test_a_logit_bias_key_that_is_no_token_id_fails_its_line_not_the_checker() -> None:
    content = b"\n".join([line("ok"), line("poison", logit_bias={"\u00b2": 1})])

    with pytest.raises(InvalidBatchFile) as raised:
        checked([content]).finish()

    [problem] = raised.value.errors
    assert problem.line == 2 and problem.code == "invalid_request"
    assert (problem.param or "").startswith("body")


def test_lines_refused_under_other_caps_when_read_back_are_named_not_raised() -> None:
    content = b"\n".join([line("a", n=2), line("b", n=8)])
    index, _ = checked([content]).finish()
    start, end = index.span(0, 2)

    first, second = lines_in(
        content[start:end], index.numbers(0, 2), LineRules(CHAT, max_n=4, max_tokens_limit=None)
    )

    assert isinstance(first, ParsedLine) and isinstance(second, InvalidRequest) and second.param == "n"


def test_a_file_stops_being_checked_once_enough_problems_are_listed() -> None:
    check = checked([b"{broken\n" * (MAX_REPORTED_ERRORS + 50)])

    assert check.full
    with pytest.raises(InvalidBatchFile) as raised:
        check.finish()
    assert len(raised.value.errors) == MAX_REPORTED_ERRORS
