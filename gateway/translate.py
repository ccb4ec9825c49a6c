"""Owns the pure conversions between the OpenAI schema and the job protocol.

Requests become ``GenerationJob``s; token events become OpenAI objects and
chunks; live workers become the model list. Nothing here does I/O or reads a
clock: ids and timestamps come in as arguments, so every function is tested by
comparing whole objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import MISSING

from gateway.openai_schema import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessageParam,
    Completion,
    CompletionChoice,
    CompletionRequest,
    FinishReasonName,
    ModelCard,
    ModelList,
    TextContentPart,
    Usage,
)
from shared.errors import WorkerFailed
from shared.protocol import (
    Accepted,
    ChatMessage,
    ChatPrompt,
    Delta,
    Finished,
    FinishReason,
    GenerationJob,
    SamplingSpec,
    TextPrompt,
    TokenEvent,
    TokenPrompt,
)
from shared.protocol import Usage as WireUsage
from shared.registry import WorkerInfo

CHAT_ID_PREFIX = "chatcmpl-"
COMPLETION_ID_PREFIX = "cmpl-"
# Text parts of one message are joined like vLLM does, so parts stay separate words.
_PART_SEPARATOR = "\n"
# OpenAI's newer "developer" role is what older chat templates call "system".
_ROLE_ALIASES = {"developer": "system"}
_FINISH_REASONS: dict[FinishReason, FinishReasonName] = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
}


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What every object answering one request shares."""

    id: str
    created: int
    model: str
    include_usage: bool = False
    echo: bool = False


# Requests -> jobs


def chat_job(request: ChatCompletionRequest, request_id: str, created_at: float) -> GenerationJob:
    """The job for a chat request; the worker applies the model's chat template."""
    messages = [_chat_message(message) for message in request.messages]
    max_tokens = request.max_completion_tokens or request.max_tokens
    return GenerationJob(
        request_id=request_id,
        model=request.model,
        prompt=ChatPrompt(messages=messages),
        sampling=_sampling(request, max_tokens),
        created_at=created_at,
    )


def completion_job(request: CompletionRequest, request_id: str, created_at: float) -> GenerationJob:
    """The job for a completion request: raw text or token ids, no template."""
    prompt = (
        TextPrompt(text=request.prompt)
        if isinstance(request.prompt, str)
        else TokenPrompt(token_ids=request.prompt)
    )
    return GenerationJob(
        request_id=request_id,
        model=request.model,
        prompt=prompt,
        sampling=_sampling(request, request.max_tokens),
        echo=bool(request.echo),
        created_at=created_at,
    )


def _chat_message(message: ChatMessageParam) -> ChatMessage:
    return ChatMessage(
        role=_ROLE_ALIASES.get(message.role, message.role),
        content=_content_text(message.content),
        name=message.name,
    )


def _content_text(content: str | list[TextContentPart]) -> str:
    if isinstance(content, str):
        return content
    return _PART_SEPARATOR.join(part.text for part in content)


def _sampling(request: ChatCompletionRequest | CompletionRequest, max_tokens: int | None) -> SamplingSpec:
    return SamplingSpec(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        # HF disables top-k with 0; OpenAI-compatible servers also accept -1 for that.
        top_k=0 if request.top_k == -1 else request.top_k,
        typical_p=request.typical_p,
        min_p=request.min_p,
        repetition_penalty=request.repetition_penalty,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        length_penalty=request.length_penalty,
        no_repeat_ngram_size=request.no_repeat_ngram_size,
        num_beams=request.num_beams,
        min_tokens=request.min_tokens,
        seed=request.seed,
        ignore_eos=request.ignore_eos,
        stop=_stop_list(request.stop),
        logit_bias={int(token): bias for token, bias in request.logit_bias.items()}
        if request.logit_bias
        else None,
    )


def _stop_list(stop: str | list[str] | None) -> list[str] | None:
    if isinstance(stop, str):
        return [stop]
    return list(stop) if stop else None


def chat_meta(request: ChatCompletionRequest, request_id: str, created_at: float) -> ResponseMeta:
    return ResponseMeta(
        id=CHAT_ID_PREFIX + request_id,
        created=int(created_at),
        model=request.model,
        include_usage=_wants_usage(request),
    )


def completion_meta(request: CompletionRequest, request_id: str, created_at: float) -> ResponseMeta:
    return ResponseMeta(
        id=COMPLETION_ID_PREFIX + request_id,
        created=int(created_at),
        model=request.model,
        include_usage=_wants_usage(request),
        echo=bool(request.echo),
    )


def _wants_usage(request: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(request.stream and request.stream_options and request.stream_options.include_usage)


# Events -> whole objects (non-streaming)


def usage(wire: WireUsage) -> Usage:
    return Usage(
        prompt_tokens=wire.prompt_tokens,
        completion_tokens=wire.completion_tokens,
        total_tokens=wire.total_tokens,
    )


def chat_completion(meta: ResponseMeta, events: Sequence[TokenEvent]) -> ChatCompletion:
    """Fold a request's events (Accepted ... Finished) into one chat.completion."""
    finished = _finished(events)
    message = AssistantMessage(content=_generated_text(events))
    return ChatCompletion(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        choices=[ChatChoice(message=message, finish_reason=_FINISH_REASONS[finished.finish_reason])],
        usage=usage(finished.usage),
    )


def text_completion(meta: ResponseMeta, events: Sequence[TokenEvent]) -> Completion:
    """Fold a request's events into one text_completion, echoing the prompt if asked."""
    finished = _finished(events)
    text = _echoed_prompt(meta, events) + _generated_text(events)
    return Completion(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        choices=[CompletionChoice(text=text, finish_reason=_FINISH_REASONS[finished.finish_reason])],
        usage=usage(finished.usage),
    )


def _finished(events: Iterable[TokenEvent]) -> Finished:
    for event in events:
        if isinstance(event, Finished):
            return event
    raise WorkerFailed("the worker ended the request without finishing it")


def _generated_text(events: Iterable[TokenEvent]) -> str:
    return "".join(event.text for event in events if isinstance(event, Delta))


def _echoed_prompt(meta: ResponseMeta, events: Iterable[TokenEvent]) -> str:
    if not meta.echo:
        return ""
    accepted = next((event for event in events if isinstance(event, Accepted)), None)
    return (accepted.prompt_text or "") if accepted else ""


# Events -> chunks (streaming). Failed events never get here: dispatch raises them.


def chat_chunks(meta: ResponseMeta, event: TokenEvent) -> list[ChatCompletionChunk]:
    """The chat.completion.chunk objects one event becomes (often one, sometimes none or two)."""
    if isinstance(event, Accepted):
        return [_chat_chunk(meta, ChatDelta(role="assistant", content=""))]
    if isinstance(event, Delta):
        return [_chat_chunk(meta, ChatDelta(content=event.text))] if event.text else []
    if isinstance(event, Finished):
        last = _chat_chunk(meta, ChatDelta(), _FINISH_REASONS[event.finish_reason])
        return [last, _chat_usage_chunk(meta, event)] if meta.include_usage else [last]
    return []


def _chat_chunk(
    meta: ResponseMeta, delta: ChatDelta, finish_reason: FinishReasonName | None = None
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)],
        usage=None if meta.include_usage else MISSING,
    )


def _chat_usage_chunk(meta: ResponseMeta, finished: Finished) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=meta.id, created=meta.created, model=meta.model, choices=[], usage=usage(finished.usage)
    )


def completion_chunks(meta: ResponseMeta, event: TokenEvent) -> list[Completion]:
    """The text_completion chunks one event becomes; the echoed prompt is the first text."""
    if isinstance(event, Accepted):
        return [_completion_chunk(meta, event.prompt_text)] if meta.echo and event.prompt_text else []
    if isinstance(event, Delta):
        return [_completion_chunk(meta, event.text)] if event.text else []
    if isinstance(event, Finished):
        last = _completion_chunk(meta, "", _FINISH_REASONS[event.finish_reason])
        return [last, _completion_usage_chunk(meta, event)] if meta.include_usage else [last]
    return []


def _completion_chunk(
    meta: ResponseMeta, text: str, finish_reason: FinishReasonName | None = None
) -> Completion:
    return Completion(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        choices=[CompletionChoice(text=text, finish_reason=finish_reason)],
        usage=None if meta.include_usage else MISSING,
    )


def _completion_usage_chunk(meta: ResponseMeta, finished: Finished) -> Completion:
    return Completion(
        id=meta.id, created=meta.created, model=meta.model, choices=[], usage=usage(finished.usage)
    )


# Workers -> model list


def model_list(workers: Iterable[WorkerInfo]) -> ModelList:
    """One card per served model, however many workers serve it."""
    by_model: dict[str, list[WorkerInfo]] = {}
    for worker in workers:
        by_model.setdefault(worker.model, []).append(worker)
    return ModelList(data=[_model_card(name, by_model[name]) for name in sorted(by_model)])


def _model_card(name: str, workers: Sequence[WorkerInfo]) -> ModelCard:
    return ModelCard(
        id=name,
        created=int(min(worker.started_at for worker in workers)),
        # The smallest window is the one every worker of the model can honour.
        max_model_len=min(worker.max_model_len for worker in workers),
    )
