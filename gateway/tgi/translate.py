"""Owns the pure conversions between TGI's native API and the job protocol.

Requests become ``GenerationJob``s; token events become TGI's ``GenerateResponse``
or its stream of ``StreamResponse`` events; domain errors become TGI's error body
and status. No I/O and no clock: ids and timestamps come in as arguments.

How our events map onto TGI's one-event-per-token stream:

* A ``Delta`` may complete several tokens (a multi-byte character, text held back
  while it could be a stop sequence). Its text goes on its last token and the
  others carry "", the way TGI's own incremental decoder attributes text, so the
  concatenated token texts are exactly the generated text.
* TGI's last event is the last token, carrying ``generated_text`` and ``details``.
  We only learn a token was the last when ``Finished`` arrives, so ``TgiStream``
  holds each token back until the next event. That costs a streaming client one
  decode step of latency per token; the alternative, an extra empty token after
  the real last one, would change what ``details=True`` clients count.
* ``grammar`` becomes the job's constraint (``gateway/tgi/grammar.py``).
* Logprobs come from the worker's ``Delta.logprobs`` (the job asks for them
  whenever the answer reports tokens); without them ``logprob`` is null, which
  TGI's OpenAPI schema allows.
* Tokens that complete no text (an end-of-sequence token) never reach the
  gateway, so ``generated_tokens`` (from usage) can exceed the tokens listed,
  and a generation that produced no text at all ends with one empty
  placeholder token (id 0, ``special``) because TGI's last event must have one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import MISSING

from gateway.tgi.grammar import grammar_constraint
from gateway.tgi.schema import (
    Details,
    GenerateParameters,
    GenerateRequest,
    GenerateResponse,
    Info,
    StreamDetails,
    StreamResponse,
    TgiErrorBody,
    TgiFinishReason,
    Token,
)
from shared.errors import Overloaded, TokenferryError, WorkerFailed
from shared.protocol import (
    Accepted,
    Delta,
    Finished,
    FinishReason,
    GenerationJob,
    SamplingSpec,
    TextPrompt,
    TokenEvent,
    TokenLogprob,
)
from shared.registry import WorkerInfo

# TGI's default when `parameters` is absent altogether (`default_parameters()` in lib.rs).
_ABSENT_PARAMETERS = GenerateParameters(do_sample=True)
# TGI's temperature when sampling without one.
_SAMPLING_TEMPERATURE = 1.0
_EMPTY_TOKEN = Token(id=0, text="", logprob=None, special=True)


def parameters_of(request: GenerateRequest) -> GenerateParameters:
    return request.parameters if request.parameters is not None else _ABSENT_PARAMETERS


def generate_job(
    request: GenerateRequest, model: str, request_id: str, created_at: float, *, stream: bool
) -> GenerationJob:
    """The job for a TGI request: the inputs as a raw text prompt, TGI's sampling rules."""
    parameters = parameters_of(request)
    return GenerationJob(
        request_id=request_id,
        model=model,
        prompt=TextPrompt(text=request.inputs),
        sampling=sampling(parameters),
        created_at=created_at,
        logprobs=_logprobs_wanted(parameters, stream),
        constraint=grammar_constraint(parameters.grammar),
    )


def sampling(parameters: GenerateParameters) -> SamplingSpec:
    """TGI samples if asked, or if any warper is set (``validation.rs``); otherwise it is greedy."""
    is_sampling = parameters.do_sample or any(
        value is not None
        for value in (parameters.temperature, parameters.top_k, parameters.top_p, parameters.typical_p)
    )
    temperature = (parameters.temperature or _SAMPLING_TEMPERATURE) if is_sampling else 0.0
    return SamplingSpec(
        max_tokens=parameters.max_new_tokens,
        temperature=temperature,
        top_k=parameters.top_k,
        top_p=parameters.top_p,
        typical_p=parameters.typical_p,
        repetition_penalty=parameters.repetition_penalty,
        frequency_penalty=parameters.frequency_penalty,
        seed=parameters.seed,
        stop=list(parameters.stop) or None,
    )


def _logprobs_wanted(parameters: GenerateParameters, stream: bool) -> int | None:
    """Every streamed token and every detailed answer reports logprobs; top_n_tokens adds alternatives."""
    if parameters.top_n_tokens:
        return parameters.top_n_tokens
    return 0 if stream or parameters.details else None


def finish_reason(finished: Finished) -> TgiFinishReason:
    """TGI's three reasons; a tool-call finish (never one of a TGI job, which has no tools) ended
    at the end of the calls, TGI's ``eos_token``."""
    if finished.finish_reason is FinishReason.LENGTH:
        return "length"
    if finished.finish_reason is FinishReason.TOOL_CALLS:
        return "eos_token"
    return "stop_sequence" if finished.stop_sequence is not None else "eos_token"


def delta_tokens(delta: Delta) -> list[tuple[Token, list[Token]]]:
    """The tokens a delta completes, each with its top alternatives; the text goes on the last."""
    entries: list[tuple[int, float | None, list[Token]]]
    if delta.logprobs:
        entries = [(entry.token_id, entry.logprob, _top(entry)) for entry in delta.logprobs]
    else:
        entries = [(token_id, None, []) for token_id in delta.token_ids]
    if not entries:
        return [(Token(id=0, text=delta.text, logprob=None, special=False), [])]
    last = len(entries) - 1
    return [
        (Token(id=token_id, text=delta.text if position == last else "", logprob=logprob, special=False), top)
        for position, (token_id, logprob, top) in enumerate(entries)
    ]


def _top(entry: TokenLogprob) -> list[Token]:
    return [Token(id=alt.token_id, text=alt.token, logprob=alt.logprob, special=False) for alt in entry.top]


# Events -> one response (non-streaming)


def generate_response(request: GenerateRequest, events: Sequence[TokenEvent]) -> GenerateResponse:
    """Fold a request's events (Accepted ... Finished) into TGI's answer."""
    finished = _finished(events)
    parameters = parameters_of(request)
    text = "".join(event.text for event in events if isinstance(event, Delta))
    if parameters.return_full_text:
        text = request.inputs + text
    if not parameters.details:
        return GenerateResponse(generated_text=text)
    tokens = [pair for event in events if isinstance(event, Delta) for pair in delta_tokens(event)]
    details = Details(
        finish_reason=finish_reason(finished),
        generated_tokens=finished.usage.completion_tokens,
        seed=parameters.seed,
        tokens=[token for token, _ in tokens],
        top_tokens=[top for _, top in tokens] if parameters.top_n_tokens else MISSING,
    )
    return GenerateResponse(generated_text=text, details=details)


def _finished(events: Iterable[TokenEvent]) -> Finished:
    for event in events:
        if isinstance(event, Finished):
            return event
    raise WorkerFailed("the worker ended the request without finishing it")


# Events -> stream events


@dataclass
class TgiStream:
    """Turns one request's events into TGI stream events, holding back one token (see module doc)."""

    request: GenerateRequest
    input_length: int = 0
    pending: StreamResponse | None = None
    texts: list[str] = field(default_factory=list)
    count: int = 0

    def feed(self, event: TokenEvent) -> list[StreamResponse]:
        """The stream events ready once ``event`` is known (often one, sometimes none)."""
        if isinstance(event, Accepted):
            self.input_length = event.prompt_tokens
            return []
        if isinstance(event, Delta):
            return self._tokens(event)
        if isinstance(event, Finished):
            return [self._last(event)]
        return []

    def _tokens(self, delta: Delta) -> list[StreamResponse]:
        self.texts.append(delta.text)
        ready = [] if self.pending is None else [self.pending]
        for token, top in delta_tokens(delta):
            self.count += 1
            ready.append(StreamResponse(index=self.count, token=token, top_tokens=self._top(top)))
        self.pending = ready.pop()
        return ready

    def _top(self, top: list[Token]) -> list[Token] | MISSING:
        return top if parameters_of(self.request).top_n_tokens else MISSING

    def _last(self, finished: Finished) -> StreamResponse:
        parameters = parameters_of(self.request)
        last = self.pending or StreamResponse(index=self.count + 1, token=_EMPTY_TOKEN)
        self.pending = None
        prefix = self.request.inputs if parameters.return_full_text else ""
        details = StreamDetails(
            finish_reason=finish_reason(finished),
            generated_tokens=finished.usage.completion_tokens,
            seed=parameters.seed,
            input_length=self.input_length,
        )
        return last.model_copy(
            update={
                "generated_text": prefix + "".join(self.texts),
                "details": details if parameters.details else None,
            }
        )


# Workers -> /info


def info(model: str, workers: Iterable[WorkerInfo], version: str) -> Info:
    """What TGI's /info says about ``model`` served by ``workers``: the smallest context window of theirs."""
    context = min(worker.max_model_len for worker in workers)
    return Info(model_id=model, max_input_tokens=context - 1, max_total_tokens=context, version=version)


# Errors


def tgi_error(error: TokenferryError) -> tuple[int, TgiErrorBody]:
    """TGI's status and body for a domain error: 422 "validation" for a bad request, as TGI answers."""
    body = TgiErrorBody(error=error.message, error_type=_error_type(error))
    return (422 if error.status == 400 else error.status), body


def _error_type(error: TokenferryError) -> str:
    if isinstance(error, Overloaded):
        return "overloaded"
    if error.status < 500:
        return "validation"
    if isinstance(error, WorkerFailed):
        return "generation"
    return error.code or error.type
