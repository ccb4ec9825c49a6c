"""Reasoning parsers: ``<think>...</think>`` split into reasoning and content, whole and streamed."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.requests.reasoning import ReasoningSplitter

Name = Literal["deepseek_r1", "qwen3"]


def split(name: Name, pieces: Sequence[str]) -> tuple[str, str]:
    """(reasoning, content) as a streaming client accumulates them."""
    splitter = ReasoningSplitter(name)
    outputs = [splitter.feed(piece) for piece in pieces] + [splitter.finish()]
    return "".join(o.reasoning for o in outputs), "".join(o.content for o in outputs)


CASES: list[tuple[Name, str, str, str]] = [
    # DeepSeek-R1: the template opened the thinking, the output starts inside it.
    (
        "deepseek_r1",
        "Paris is in France.\n</think>\n\nThe capital is Paris.",
        "Paris is in France.\n",
        "The capital is Paris.",
    ),
    # ... or the model writes the opening marker anyway.
    ("deepseek_r1", "<think>\nhmm</think>The answer.", "\nhmm", "The answer."),
    # Never closed (cut by length): all of it was thinking.
    ("deepseek_r1", "still thinking about it", "still thinking about it", ""),
    ("qwen3", "<think>\nLet me think.\n</think>\n\nHello!", "\nLet me think.\n", "Hello!"),
    # enable_thinking: false (the template wrote an empty block into the prompt): all content.
    ("qwen3", "Hello! No thinking here.", "", "Hello! No thinking here."),
    # Only the first block is thinking; markers later in the answer are content.
    ("qwen3", "<think>a</think>b <think>c</think>", "a", "b <think>c</think>"),
    ("qwen3", "", "", ""),
    ("deepseek_r1", "", "", ""),
]


@pytest.mark.parametrize(("name", "output", "reasoning", "content"), CASES)
def test_thinking_is_split_off_whole_and_one_character_at_a_time(
    name: Name, output: str, reasoning: str, content: str
) -> None:
    assert split(name, [output]) == (reasoning, content)
    assert split(name, list(output)) == (reasoning, content)


@pytest.mark.parametrize(("name", "output", "reasoning", "content"), CASES)
@given(positions=st.lists(st.integers(min_value=0, max_value=200), max_size=10))
def test_markers_split_across_deltas_anywhere_give_the_same_split(
    name: Name, output: str, reasoning: str, content: str, positions: list[int]
) -> None:
    bounds = sorted({0, len(output), *(p % (len(output) + 1) for p in positions)})
    pieces = [output[a:b] for a, b in itertools.pairwise(bounds)]

    assert split(name, pieces) == (reasoning, content)


def test_reasoning_streams_as_it_comes_and_only_a_possible_marker_waits() -> None:
    splitter = ReasoningSplitter("qwen3")

    assert splitter.feed("<thi").reasoning == ""
    assert splitter.feed("nk>Step one. ").reasoning == "Step one. "
    assert splitter.feed("Step two </th").reasoning == "Step two "
    after = splitter.feed("ink>\n\nDone")
    assert (after.reasoning, after.content) == ("", "Done")


def test_a_partial_end_marker_at_the_end_is_still_reasoning() -> None:
    assert split("deepseek_r1", ["thinking </thi"]) == ("thinking </thi", "")
