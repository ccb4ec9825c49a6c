"""Tool-call parsers on crafted model outputs: whole, character by character and cut anywhere.

What a client checks: the content it reads, and the calls it assembles from the
fragments (name and arguments joined per index, ids stable).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.protocol import ToolCallDelta, ToolChoice
from worker.requests.tool_calls import CallIds, ToolCallParser, call_parser, resolve_parser_name

AUTO = ToolChoice(mode="auto")


@dataclass
class Assembled:
    content: str
    calls: list[dict[str, str]]


def assemble(parser: ToolCallParser, pieces: Sequence[str]) -> Assembled:
    """What a streaming client ends up with: the content, and each call's fragments joined."""
    outputs = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    calls: dict[int, dict[str, str]] = {}
    for delta in (call for output in outputs for call in output.calls):
        call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
        call["id"] += delta.id or ""
        call["name"] += delta.name or ""
        call["arguments"] += delta.arguments
    return Assembled("".join(output.content for output in outputs), [calls[i] for i in sorted(calls)])


def parse(name: str, pieces: Sequence[str], choice: ToolChoice = AUTO, request_id: str = "req") -> Assembled:
    parser = call_parser(choice, name, CallIds(request_id))  # type: ignore[arg-type]
    assert parser is not None
    return assemble(parser, pieces)


def cuts(text: str, positions: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(p % (len(text) + 1) for p in positions)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def names_and_arguments(result: Assembled) -> list[tuple[str, object]]:
    return [(call["name"], json.loads(call["arguments"])) for call in result.calls]


HERMES_TWO_CALLS = (
    "Let me look that up.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>'
)
LLAMA3_TWO_CALLS = (
    '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
    '{"name": "get_time", "parameters": {"zone": "Europe/Paris"}}'
)
MISTRAL_TWO_CALLS = (
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
    '{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}]'
)
TWO_CALLS = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"zone": "Europe/Paris"})]
CASES = [
    ("hermes", HERMES_TWO_CALLS, "Let me look that up.\n"),
    ("llama3_json", LLAMA3_TWO_CALLS, ""),
    ("llama3_json", "<|python_tag|>" + LLAMA3_TWO_CALLS, ""),
    ("mistral", MISTRAL_TWO_CALLS, ""),
    ("mistral", "Sure. " + MISTRAL_TWO_CALLS, "Sure. "),
]


@pytest.mark.parametrize(("name", "output", "content"), CASES)
def test_calls_are_found_whole_and_streamed_one_character_at_a_time(
    name: str, output: str, content: str
) -> None:
    whole = parse(name, [output])
    streamed = parse(name, list(output))

    assert whole.content == streamed.content == content
    assert names_and_arguments(whole) == names_and_arguments(streamed) == TWO_CALLS
    assert whole.calls == streamed.calls  # the same ids too


@pytest.mark.parametrize(("name", "output", "content"), CASES)
@given(positions=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_split_of_the_output_gives_the_same_result(
    name: str, output: str, content: str, positions: list[int]
) -> None:
    assert parse(name, cuts(output, positions)) == parse(name, [output])


def test_mistral_v11_calls_name_then_args() -> None:
    output = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}'

    result = parse("mistral", list(output))

    assert names_and_arguments(result) == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})]
    assert result.content == ""


def test_text_that_cannot_be_a_call_streams_at_once_and_a_possible_marker_is_held() -> None:
    parser = call_parser(AUTO, "hermes", CallIds("req"))
    assert parser is not None

    assert parser.feed("Hello ").content == "Hello "
    assert parser.feed("<tool").content == ""  # may be <tool_call>
    assert parser.feed("box> is a tag").content == "<toolbox> is a tag"
    assert parser.finish().content == ""
    assert not parser.has_calls


@pytest.mark.parametrize(
    ("name", "output"),
    [
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'),  # unbalanced JSON
        ("hermes", '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>'),  # no name
        (
            "hermes",
            '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>',
        ),  # arguments not an object
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": '),  # cut off (length)
        ("llama3_json", '{"answer": 42}'),  # JSON, but no call
        ("llama3_json", '{"name": "f", "parameters": {"a": 1'),  # cut off
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}'),  # the list never closes
        ("mistral", "[TOOL_CALLS] not json at all"),
    ],
)
def test_a_malformed_call_stays_content_exactly_as_written(name: str, output: str) -> None:
    for pieces in ([output], list(output)):
        parser = call_parser(AUTO, name, CallIds("req"))  # type: ignore[arg-type]
        assert parser is not None
        result = assemble(parser, pieces)
        assert (result.content, result.calls) == (output, [])
        assert not parser.has_calls


def test_content_after_a_malformed_call_and_a_good_call_after_it() -> None:
    output = 'A <tool_call>{"oops"}</tool_call> B <tool_call>{"name": "f", "arguments": {}}</tool_call>'

    result = parse("hermes", list(output))

    assert result.content == 'A <tool_call>{"oops"}</tool_call> B '
    assert names_and_arguments(result) == [("f", {})]


def test_an_unclosed_call_at_the_end_counts_when_its_json_is_whole() -> None:
    result = parse("hermes", ['<tool_call>\n{"name": "f", "arguments": {"q": "x"}}\n'])

    assert (result.content, names_and_arguments(result)) == ("", [("f", {"q": "x"})])


def test_arguments_given_as_json_text_are_kept_as_json() -> None:
    result = parse("hermes", ['<tool_call>{"name": "f", "arguments": "{\\"q\\": 1}"}</tool_call>'])

    assert names_and_arguments(result) == [("f", {"q": 1})]


def test_ids_are_deterministic_per_request_choice_and_call() -> None:
    first, again = parse("hermes", [HERMES_TWO_CALLS]), parse("hermes", list(HERMES_TWO_CALLS))
    other = parse("hermes", [HERMES_TWO_CALLS], request_id="another")

    ids = [call["id"] for call in first.calls]
    assert ids == [call["id"] for call in again.calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") and len(i) == 29 for i in ids)
    assert not set(ids) & {call["id"] for call in other.calls}
    assert CallIds("req", 0).of(0) != CallIds("req", 1).of(0)


def test_first_fragment_of_a_call_carries_index_id_and_name() -> None:
    parser = call_parser(AUTO, "hermes", CallIds("req"))
    assert parser is not None

    calls = parser.feed(HERMES_TWO_CALLS).calls

    assert calls[0] == ToolCallDelta(
        index=0, id=CallIds("req").of(0), name="get_weather", arguments='{"city": "Paris", "unit": "celsius"}'
    )
    assert [call.index for call in calls] == [0, 1]


# --- required and named tool choices: the constrained text is the calls ----------------------------------


def test_named_choice_streams_the_whole_text_as_the_arguments_of_one_call() -> None:
    parser = call_parser(ToolChoice(mode="named", name="get_weather"), "hermes", CallIds("req"))
    assert parser is not None

    fragments = [call for piece in ['{"city": ', '"Paris"', "}"] for call in parser.feed(piece).calls]

    assert fragments[0] == ToolCallDelta(
        index=0, id=CallIds("req").of(0), name="get_weather", arguments='{"city": '
    )
    assert [(f.index, f.id, f.name, f.arguments) for f in fragments[1:]] == [
        (0, None, None, '"Paris"'),
        (0, None, None, "}"),
    ]
    assert parser.has_calls


def test_required_choice_parses_the_list_of_calls_and_never_gives_content() -> None:
    output = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, ' + (
        '{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}]'
    )
    required = ToolChoice(mode="required")

    whole, streamed = parse("hermes", [output], required), parse("hermes", list(output), required)

    assert whole == streamed
    assert (whole.content, names_and_arguments(whole)) == ("", TWO_CALLS)


def test_required_choice_cut_by_length_keeps_only_the_whole_calls() -> None:
    output = '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": '

    result = parse("hermes", list(output), ToolChoice(mode="required"))

    assert (result.content, names_and_arguments(result)) == ("", [("a", {})])


def test_no_tools_or_tool_choice_none_parse_nothing() -> None:
    assert call_parser(None, "hermes", CallIds("req")) is None
    assert call_parser(ToolChoice(mode="none"), "hermes", CallIds("req")) is None
    assert call_parser(AUTO, None, CallIds("req")) is None


# --- which format auto means ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for tool in tools %}<tool_call>{% endfor %}", "hermes"),  # Qwen2.5 / Hermes
        ("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}", "mistral"),
        ("{{- '<|python_tag|>' }}{{ '<|eom_id|>' }}", "llama3_json"),
        ("{{ messages }}", "hermes"),  # unknown: the fallback's format
        (None, "hermes"),
    ],
)
def test_auto_picks_the_format_from_the_chat_template(template: str | None, expected: str) -> None:
    assert resolve_parser_name("auto", template) == expected


def test_an_explicit_parser_wins_over_the_template_and_none_turns_parsing_off() -> None:
    assert resolve_parser_name("mistral", "<tool_call>") == "mistral"
    assert resolve_parser_name("none", "<tool_call>") is None


def test_without_parallel_calls_only_the_first_call_counts() -> None:
    single = ToolChoice(mode="auto", parallel=False)

    for name, output, content in CASES:
        result = parse(name, list(output), single)
        assert (result.content, names_and_arguments(result)) == (content, TWO_CALLS[:1])
