"""Owns folding one job's events into each of its choices' parts, for answers that are not streamed.

A choice's deltas arrive in order, interleaved with other choices' by ``index``;
each ``ChoiceFold`` keeps its content, reasoning and tool-call fragments apart
(``gateway/openai/assistant.py`` joins the fragments by call index), its logprobs and
its finish reason. ``gateway/openai/render.py`` turns the folds into OpenAI objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.openai.assistant import CallFold, fold_calls
from shared.errors import WorkerFailed
from shared.protocol import ChoiceFinished, Delta, Finished, FinishReason, PromptLogprob, TokenEvent
from shared.protocol import TokenLogprob as WireLogprob


@dataclass
class ChoiceFold:
    """One choice's parts so far: text, reasoning, tool calls, logprobs, finish reason."""

    texts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, CallFold] = field(default_factory=dict)
    logprobs: list[WireLogprob] | None = None
    prompt_logprobs: list[PromptLogprob] | None = None
    finish_reason: FinishReason | None = None

    def add(self, delta: Delta) -> None:
        self.texts.append(delta.text)
        self.reasoning.append(delta.reasoning)
        fold_calls(self.calls, delta.tool_calls)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs

    @property
    def text(self) -> str:
        return "".join(self.texts)


def fold_choices(events: Sequence[TokenEvent], n: int) -> tuple[list[ChoiceFold], Finished]:
    """Each choice's text, logprobs and finish reason, from one job's events."""
    choices = [ChoiceFold() for _ in range(n)]
    finished: Finished | None = None
    for event in events:
        if isinstance(event, Delta):
            choices[event.index].add(event)
        elif isinstance(event, ChoiceFinished):
            choices[event.index].finish_reason = event.finish_reason
        elif isinstance(event, Finished):
            finished = event
    if finished is None:
        raise WorkerFailed("the worker ended the request without finishing it")
    return choices, finished
