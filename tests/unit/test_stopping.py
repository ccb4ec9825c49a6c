from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.requests.stopping import StopMatcher, StopResult


def feed_all(matcher: StopMatcher, pieces: Sequence[str]) -> tuple[str, str | None]:
    """Feed pieces until a stop; return everything released (flushed at the end) and the stop."""
    released = []
    for piece in pieces:
        result = matcher.feed(piece)
        released.append(result.text)
        if result.is_stopped:
            return "".join(released), result.stop_sequence
    released.append(matcher.flush())
    return "".join(released), None


def test_stop_sequence_split_across_tokens_is_trimmed() -> None:
    matcher = StopMatcher(["###"])

    assert matcher.feed("Hello #") == StopResult("Hello ")
    assert matcher.feed("#") == StopResult("")
    assert matcher.feed("# world") == StopResult("", "###")


def test_partial_match_that_is_not_a_stop_is_released_later() -> None:
    matcher = StopMatcher(["###"])

    assert matcher.feed("a ##") == StopResult("a ")
    assert matcher.feed(" b") == StopResult("## b")
    assert matcher.flush() == ""


def test_held_tail_shrinks_to_the_longest_prefix_still_possible() -> None:
    matcher = StopMatcher(["abab"])

    assert matcher.feed("xaba") == StopResult("x")  # "aba" could still become "abab"
    assert matcher.feed("a") == StopResult("aba")  # "abaa": only the last "a" may still start it
    assert matcher.feed("bab") == StopResult("", "abab")


def test_without_a_stop_flush_releases_the_held_text() -> None:
    matcher = StopMatcher(["</s>"])

    assert matcher.feed("the end <") == StopResult("the end ")
    assert matcher.flush() == "<"
    assert matcher.flush() == ""


def test_stop_at_the_very_start_releases_nothing() -> None:
    matcher = StopMatcher(["STOP"])

    assert matcher.feed("STOP and more") == StopResult("", "STOP")


def test_text_after_the_stop_is_never_released() -> None:
    matcher = StopMatcher(["\n\n"])

    assert matcher.feed("one\n") == StopResult("one")
    assert matcher.feed("\ntwo") == StopResult("", "\n\n")
    assert matcher.feed("three") == StopResult("")
    assert matcher.flush() == ""
    assert matcher.is_stopped


def test_several_stop_sequences_first_to_complete_wins() -> None:
    matcher = StopMatcher(["world", "lo w", "xyz"])

    assert matcher.feed("hello world") == StopResult("hel", "lo w")


def test_several_stop_sequences_ending_together_the_longest_wins() -> None:
    matcher = StopMatcher(["b", "ab"])

    assert matcher.feed("xab") == StopResult("x", "ab")


@pytest.mark.parametrize("split", [1, 2, 3, 5, 100])
def test_result_does_not_depend_on_how_text_is_split(split: int) -> None:
    text = "say abcd then abcdef"
    pieces = [text[i : i + split] for i in range(0, len(text), split)]

    assert feed_all(StopMatcher(["bcd", "abcdef"]), pieces) == ("say a", "bcd")


def test_stop_split_over_many_single_character_pieces() -> None:
    assert feed_all(StopMatcher(["<|end|>"]), list("answer<|end|>junk")) == ("answer", "<|end|>")


def test_overlapping_prefixes_of_different_stops_are_held() -> None:
    matcher = StopMatcher(["abc", "bcd"])

    assert matcher.feed("xab") == StopResult("x")
    assert matcher.feed("d") == StopResult("abd")


def test_empty_stop_list_passes_text_through() -> None:
    matcher = StopMatcher([])

    assert matcher.feed("anything ###") == StopResult("anything ###")
    assert matcher.flush() == ""


def test_empty_stop_strings_are_ignored() -> None:
    matcher = StopMatcher(["", "!"])

    assert matcher.feed("hi!") == StopResult("hi", "!")


def test_unicode_stop_sequence() -> None:
    assert feed_all(StopMatcher(["👋🏽"]), ["hé ", "👋", "🏽", " bye"]) == ("hé ", "👋🏽")


# A small alphabet, so that stops overlap the text and each other often.
_texts = st.text(alphabet="ab#\n", max_size=30)
_stops = st.lists(st.text(alphabet="ab#\n", min_size=1, max_size=5), max_size=4)


@given(text=_texts, stops=_stops, cuts=st.lists(st.integers(min_value=0, max_value=30)))
def test_any_split_of_the_text_finds_what_the_whole_text_finds(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    bounds = sorted({0, len(text), *(cut for cut in cuts if cut <= len(text))})
    pieces = [text[start:end] for start, end in itertools.pairwise(bounds)]

    assert feed_all(StopMatcher(stops), pieces) == feed_all(StopMatcher(stops), [text])


@given(text=_texts, stops=_stops)
def test_the_released_text_ends_before_the_first_stop_to_complete(text: str, stops: list[str]) -> None:
    released, stop = feed_all(StopMatcher(stops), list(text))
    ends = [(text.find(s) + len(s), -len(s), s) for s in stops if s in text]

    if not ends:
        assert (released, stop) == (text, None)
    else:
        end, _, first = min(ends)
        assert (released, stop) == (text[: end - len(first)], first)


def _bytes_allocated_by(action: Callable[[], object]) -> int:
    """Peak memory ``action`` allocates while it runs, the result it keeps included."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        kept = action()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return peak


@pytest.mark.parametrize("stop", ["x" * 20_000, "ab" * 10_000, "é" * 20_000])
def test_a_long_stop_costs_memory_linear_in_its_length(stop: str) -> None:
    def match_it() -> StopMatcher:
        matcher = StopMatcher([stop])
        matcher.feed(stop[:-1])  # the whole stop but one character is held back
        assert matcher.feed(stop[-1:]) == StopResult("", stop)
        return matcher

    # A few bytes per character (the stop's failure table, the held text), never the
    # square of the length: 20,000 characters held as every prefix would be ~200 MB.
    assert _bytes_allocated_by(match_it) < 16 * len(stop)
