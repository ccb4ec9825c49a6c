"""Batch-lane events are held until the request ends (or hold_s passes), each choice's deltas merged."""

from __future__ import annotations

from shared.protocol import ChoiceFinished, Delta, Finished, FinishReason, TokenLogprob, ToolCallDelta, Usage
from worker.driver.held_events import HeldEvents, merged


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _delta(text: str, token_id: int, index: int = 0, logprob: float | None = None) -> Delta:
    logprobs = None if logprob is None else [TokenLogprob(token_id=token_id, token=text, logprob=logprob)]
    return Delta(text=text, token_ids=[token_id], index=index, logprobs=logprobs)


def _finished(tokens: int) -> Finished:
    return Finished(finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=3, completion_tokens=tokens))


def test_events_are_held_until_the_terminal_event_then_released_with_deltas_merged() -> None:
    held = HeldEvents(hold_s=1.0, clock=_Clock())
    assert held.take("r", [_delta("Hel", 1)]) == []
    assert held.take("r", [_delta("lo", 2)]) == []
    choice_end = ChoiceFinished(index=0, finish_reason=FinishReason.LENGTH, completion_tokens=3)
    released = held.take("r", [_delta("!", 3), choice_end, _finished(3)])
    assert released == [Delta(text="Hello!", token_ids=[1, 2, 3], index=0), choice_end, _finished(3)]
    assert held.due() == []  # nothing left behind


def test_held_events_go_out_once_the_oldest_has_waited_hold_s() -> None:
    clock = _Clock()
    held = HeldEvents(hold_s=1.0, clock=clock)
    held.take("old", [_delta("a", 1)])
    clock.now = 0.6
    held.take("new", [_delta("b", 2)])
    held.take("old", [_delta("c", 3)])
    clock.now = 1.0
    assert held.due() == [("old", Delta(text="ac", token_ids=[1, 3]))]
    clock.now = 1.6
    assert held.due() == [("new", Delta(text="b", token_ids=[2]))]


def test_dropped_requests_release_nothing() -> None:
    clock = _Clock()
    held = HeldEvents(hold_s=1.0, clock=clock)
    held.take("aborted", [_delta("x", 1)])
    held.drop("aborted")
    clock.now = 5.0
    assert held.due() == []


def test_merging_keeps_each_choices_order_and_logprobs() -> None:
    events = [
        _delta("A", 1, index=0, logprob=-0.1),
        _delta("x", 7, index=1, logprob=-0.5),
        _delta("B", 2, index=0, logprob=-0.2),
        ChoiceFinished(index=0, finish_reason=FinishReason.STOP, completion_tokens=2),
        _delta("y", 8, index=1, logprob=-0.6),
    ]
    first, second, choice_end = merged(events)
    assert isinstance(first, Delta) and isinstance(second, Delta)
    assert (first.index, first.text, first.token_ids) == (0, "AB", [1, 2])
    assert [entry.logprob for entry in first.logprobs or []] == [-0.1, -0.2]
    assert (second.index, second.text, second.token_ids) == (1, "xy", [7, 8])
    assert [entry.logprob for entry in second.logprobs or []] == [-0.5, -0.6]
    assert choice_end.type == "choice_finished"


def test_merged_deltas_keep_every_reasoning_piece_and_tool_call_fragment() -> None:
    opening = ToolCallDelta(index=0, id="call_1", name="get_weather")
    deltas = [
        Delta(text="", reasoning="Think", token_ids=[1]),
        Delta(text="", reasoning="ing.", token_ids=[2]),
        Delta(text="", token_ids=[3], tool_calls=[opening]),
        Delta(text="", token_ids=[4], tool_calls=[ToolCallDelta(index=0, arguments='{"city": ')]),
        Delta(text="", token_ids=[5], tool_calls=[ToolCallDelta(index=0, arguments='"Paris"}')]),
    ]
    [whole] = merged(deltas)
    assert whole.reasoning == "Thinking." and whole.token_ids == [1, 2, 3, 4, 5]  # type: ignore[union-attr]
    calls = whole.tool_calls or []  # type: ignore[union-attr]
    assert calls[0] == opening and "".join(call.arguments for call in calls) == '{"city": "Paris"}'
