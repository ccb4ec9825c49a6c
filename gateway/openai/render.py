"""Owns the pure conversions from token events to OpenAI objects: whole responses and stream chunks.

A request's events are ``Accepted``, then ``Delta``s and one ``ChoiceFinished``
per choice (each with its choice ``index``), then the terminal ``Finished`` with
the usage of all choices. A completions request listing several prompts runs one
job per prompt; ``gateway/dispatch/fanout.py`` re-indexes their events to OpenAI's choice
index (``prompt_index * n + i``) and hands their ``Accepted`` events over in prompt
order, so the k-th ``Accepted`` seen here is prompt k's.

Streams need a little memory (which prompt's text to echo, which choices ended,
how many prompts finished), so each streamed response gets its own small
``ChatStream`` or ``CompletionStream``; everything else is a free function.
A worker that sends no ``ChoiceFinished`` (an older one) is still understood: the
choices it left open end with ``Finished``'s reason. Logprobs take OpenAI's shapes
in ``gateway/openai/logprobs.py``; a chat choice's reasoning and tool calls take
theirs in ``gateway/openai/assistant.py``, and a request that used the deprecated
``functions`` (``ResponseMeta.legacy_functions``) gets ``function_call`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import MISSING, BaseModel

from gateway.openai import assistant
from gateway.openai.folds import ChoiceFold, fold_choices
from gateway.openai.logprobs import chat_logprobs, completion_logprobs
from gateway.openai.objects import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionTokensDetails,
    FinishReasonName,
    PromptTokensDetails,
    Usage,
)
from shared.protocol import (
    Accepted,
    ChoiceFinished,
    Delta,
    Finished,
    FinishReason,
    PromptLogprob,
    TokenEvent,
)
from shared.protocol import TokenLogprob as WireLogprob
from shared.protocol import Usage as WireUsage

_FINISH_REASONS: dict[FinishReason, FinishReasonName] = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_calls",
}


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What every object answering one request shares."""

    id: str
    created: int
    model: str
    include_usage: bool = False
    echo: bool = False
    n: int = 1  # choices per prompt
    prompts: int = 1  # jobs whose events make up the response
    logprobs: bool = False  # with echo: the prompt's text goes out with its logprobs
    legacy_functions: bool = False  # calls go out as the deprecated function_call

    @property
    def defers_echo(self) -> bool:
        return self.echo and self.logprobs


def usage(wire: WireUsage) -> Usage:
    return summed_usage([wire])


def summed_usage(usages: Iterable[WireUsage]) -> Usage:
    """The usage of several jobs (one per prompt): OpenAI sums prompts, completions and reasoning."""
    prompt = completion = reasoning = cached = 0
    for one in usages:
        prompt += one.prompt_tokens
        completion += one.completion_tokens
        reasoning += one.reasoning_tokens
        cached += one.cached_tokens
    details = CompletionTokensDetails(reasoning_tokens=reasoning) if reasoning else MISSING
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        completion_tokens_details=details,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached) if cached else MISSING,
    )


# Events -> whole objects (non-streaming)


def chat_completion(meta: ResponseMeta, events: Sequence[TokenEvent]) -> ChatCompletion:
    """Fold a request's events (Accepted ... Finished) into one chat.completion."""
    folds, finished = fold_choices(events, meta.n)
    legacy = meta.legacy_functions
    choices = [
        ChatChoice(
            index=index,
            message=assistant.assistant_message(fold.text, "".join(fold.reasoning), fold.calls, legacy),
            logprobs=None if fold.logprobs is None else chat_logprobs(fold.logprobs),
            finish_reason=assistant.finish_reason(
                _FINISH_REASONS[fold.finish_reason or finished.finish_reason], legacy
            ),
        )
        for index, fold in enumerate(folds)
    ]
    return ChatCompletion(
        id=meta.id, created=meta.created, model=meta.model, choices=choices, usage=usage(finished.usage)
    )


def text_completion(meta: ResponseMeta, results: Sequence[Sequence[TokenEvent]]) -> Completion:
    """Fold the events of each prompt's job (in prompt order) into one text_completion."""
    choices: list[CompletionChoice] = []
    finished: list[Finished] = []
    for prompt_index, events in enumerate(results):
        folds, done = fold_choices(events, meta.n)
        finished.append(done)
        echo = _echoed_prompt(meta, events)
        for index, fold in enumerate(folds):
            choices.append(_completion_choice(prompt_index * meta.n + index, echo, fold, done))
    return Completion(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        choices=choices,
        usage=summed_usage(done.usage for done in finished),
    )


def _completion_choice(index: int, echo: str, fold: ChoiceFold, finished: Finished) -> CompletionChoice:
    entries: list[WireLogprob | PromptLogprob] = [*(fold.prompt_logprobs or []), *(fold.logprobs or [])]
    return CompletionChoice(
        text=echo + fold.text,
        index=index,
        logprobs=None if fold.logprobs is None else completion_logprobs(entries, 0),
        finish_reason=_FINISH_REASONS[fold.finish_reason or finished.finish_reason],
    )


def _echoed_prompt(meta: ResponseMeta, events: Iterable[TokenEvent]) -> str:
    if not meta.echo:
        return ""
    accepted = next((event for event in events if isinstance(event, Accepted)), None)
    return (accepted.prompt_text or "") if accepted else ""


# Events -> chunks (streaming). Failed events never get here: dispatch raises them.

ChunkT = TypeVar("ChunkT", ChatCompletionChunk, Completion)


class _Chunks(Generic[ChunkT]):
    """What a stream's chunks share, chat or text: the envelope, the choices' ends, the usage.

    Remembers which choices have ended and which jobs have finished, for the stream's last chunks.
    """

    def __init__(
        self,
        meta: ResponseMeta,
        chunk_type: type[ChunkT],
        ended_choice: Callable[[int, FinishReasonName], BaseModel],
    ) -> None:
        self._meta = meta
        self._chunk_type: type[ChunkT] = chunk_type
        self._ended_choice = ended_choice  # a choice's last chunk: no content, its finish reason
        self._ended: set[int] = set()
        self._finished: list[Finished] = []

    def of(self, choice: BaseModel) -> ChunkT:
        """The chunk carrying ``choice`` (its usage null when the client asked for usage)."""
        return self._envelope(choices=[choice], usage=None if self._meta.include_usage else MISSING)

    def ending(self, event: ChoiceFinished | Finished) -> list[ChunkT]:
        """A choice's end; once every job has finished, the ends of the choices still open and the usage."""
        if isinstance(event, ChoiceFinished):
            self._ended.add(event.index)
            return [self.of(self._ended_choice(event.index, _FINISH_REASONS[event.finish_reason]))]
        self._finished.append(event)
        if len(self._finished) < self._meta.prompts:
            return []
        reason = _FINISH_REASONS[event.finish_reason]
        still_open = [index for index in range(self._meta.prompts * self._meta.n) if index not in self._ended]
        chunks = [self.of(self._ended_choice(index, reason)) for index in still_open]
        if self._meta.include_usage:
            chunks.append(
                self._envelope(choices=[], usage=summed_usage(done.usage for done in self._finished))
            )
        return chunks

    def _envelope(self, **fields: Any) -> ChunkT:
        meta = self._meta
        chunk: ChunkT = self._chunk_type(id=meta.id, created=meta.created, model=meta.model, **fields)
        return chunk


class ChatStream:
    """Turns one chat request's events into chat.completion.chunk objects."""

    def __init__(self, meta: ResponseMeta) -> None:
        self._meta = meta
        self._chunks = _Chunks(meta, ChatCompletionChunk, self._ended_choice)

    def chunks(self, event: TokenEvent) -> list[ChatCompletionChunk]:
        """The chunks one event becomes (often one, sometimes none or several)."""
        if isinstance(event, Accepted):
            return [self._chunks.of(_opening_chat_choice(index)) for index in range(self._meta.n)]
        if isinstance(event, Delta):
            return [self._delta_chunk(event)] if assistant.has_parts(event) else []
        if isinstance(event, ChoiceFinished | Finished):
            return self._chunks.ending(event)
        return []

    def _delta_chunk(self, delta: Delta) -> ChatCompletionChunk:
        logprobs = None if delta.logprobs is None else chat_logprobs(delta.logprobs)
        content = assistant.chat_delta(delta, self._meta.legacy_functions)
        return self._chunks.of(ChatChunkChoice(index=delta.index, delta=content, logprobs=logprobs))

    def _ended_choice(self, index: int, finish_reason: FinishReasonName) -> ChatChunkChoice:
        reason = assistant.finish_reason(finish_reason, self._meta.legacy_functions)
        return ChatChunkChoice(index=index, delta=ChatDelta(), finish_reason=reason)


def _opening_chat_choice(index: int) -> ChatChunkChoice:
    return ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))


class CompletionStream:
    """Turns one completion request's events (of all its prompts) into text_completion chunks."""

    def __init__(self, meta: ResponseMeta) -> None:
        self._meta = meta
        self._chunks = _Chunks(meta, Completion, _ended_completion_choice)
        self._prompt_texts: list[str] = []  # by prompt index: Accepted events arrive in prompt order
        self._offsets: dict[int, int] = {}  # by choice: where its next token's text starts

    def chunks(self, event: TokenEvent) -> list[Completion]:
        """The chunks one event becomes; the echoed prompt is each choice's first text."""
        if isinstance(event, Accepted):
            return self._accepted(event)
        if isinstance(event, Delta):
            return self._delta(event)
        if isinstance(event, ChoiceFinished | Finished):
            return self._chunks.ending(event)
        return []

    def _accepted(self, event: Accepted) -> list[Completion]:
        prompt_index = len(self._prompt_texts)
        text = (event.prompt_text or "") if self._meta.echo else ""
        self._prompt_texts.append(text)
        if not text or self._meta.defers_echo:
            return []
        first = prompt_index * self._meta.n
        choices = range(first, first + self._meta.n)
        return [self._chunks.of(CompletionChoice(text=text, index=index)) for index in choices]

    def _delta(self, delta: Delta) -> list[Completion]:
        text = delta.text
        entries: list[WireLogprob | PromptLogprob] = list(delta.logprobs or [])
        if delta.prompt_logprobs is not None and self._meta.defers_echo:
            text = self._prompt_texts[delta.index // self._meta.n] + text
            entries = [*delta.prompt_logprobs, *entries]
        if not text and not entries:
            return []
        logprobs = None
        if delta.logprobs is not None:
            offset = self._offsets.get(delta.index, 0)
            logprobs = completion_logprobs(entries, offset)
            self._offsets[delta.index] = offset + sum(len(entry.token) for entry in entries)
        return [self._chunks.of(CompletionChoice(text=text, index=delta.index, logprobs=logprobs))]


def _ended_completion_choice(index: int, finish_reason: FinishReasonName) -> CompletionChoice:
    return CompletionChoice(text="", index=index, finish_reason=finish_reason)
