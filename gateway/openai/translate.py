"""Owns the pure conversions from OpenAI requests to the job protocol (and live workers to the model list).

Requests become ``GenerationJob``s: one per prompt (a completions request may list
several; they run as separate jobs, ``{request_id}-p{j}``, merged by the gateway),
each asking its worker for ``n`` choices. The reverse direction, events to OpenAI
objects, is ``gateway/openai/render.py``. Nothing here does I/O or reads a clock: ids
and timestamps come in as arguments, so every function is tested by comparing
whole objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from gateway.openai import agent_translate
from gateway.openai.messages import chat_messages
from gateway.openai.objects import ModelCard, ModelList
from gateway.openai.render import ResponseMeta
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from gateway.tokenize.schema import DetokenizeRequest, TokenizeRequest
from shared.errors import InvalidRequest
from shared.protocol import (
    ChatPrompt,
    GenerationJob,
    Prompt,
    SamplingSpec,
    TextPrompt,
    TokenizeJob,
    TokenPrompt,
)
from shared.registry import WorkerInfo

CHAT_ID_PREFIX = "chatcmpl-"
COMPLETION_ID_PREFIX = "cmpl-"


# Requests -> jobs


def request_jobs(
    request: ChatCompletionRequest | CompletionRequest, request_id: str, created_at: float, max_n: int
) -> list[GenerationJob]:
    """The jobs of a chat or completions request, once it passes the operator's caps.

    The routes and batch lines both submit what this returns (a batch line is
    refused exactly when the request would be), so an operator's cap on a request
    belongs here, not in one of its callers. ``max_tokens`` is capped by the
    quota's ``capped``, which both also apply.
    """
    check_choice_count(request, max_n)
    if isinstance(request, ChatCompletionRequest):
        return [chat_job(request, request_id, created_at)]
    return completion_jobs(request, request_id, created_at)


def compiles_grammars(request: ChatCompletionRequest | CompletionRequest) -> bool:
    """Whether ``request_jobs`` will check a schema or grammar (tools, response_format,
    structured_outputs, guided_*): work that can take long enough to stall the event loop."""
    return bool(getattr(request, "tools", None)) or bool(agent_translate.output_constraints(request))


def chat_job(request: ChatCompletionRequest, request_id: str, created_at: float) -> GenerationJob:
    """The job for a chat request; the worker applies the model's chat template."""
    setup = agent_translate.tool_setup(request)
    prompt = ChatPrompt(
        messages=chat_messages(request.messages),
        add_generation_prompt=request.add_generation_prompt is not False,
        tools=setup.tools,
        template_kwargs=agent_translate.template_kwargs(request),
    )
    return GenerationJob(
        request_id=request_id,
        model=request.model,
        prompt=prompt,
        sampling=_sampling(request, request.max_completion_tokens or request.max_tokens),
        created_at=created_at,
        n=request.n or 1,
        logprobs=_chat_logprobs(request),
        constraint=agent_translate.job_constraint(request, setup),
        tool_choice=setup.choice,
    )


def completion_jobs(request: CompletionRequest, request_id: str, created_at: float) -> list[GenerationJob]:
    """One job per prompt of a completion request: raw text or token ids, no template."""
    _check_best_of(request)
    constraint = agent_translate.job_constraint(request, agent_translate.ToolSetup())
    return [
        GenerationJob(
            request_id=prompt_request_id(request_id, index, len(request.prompt)),
            model=request.model,
            prompt=_completion_prompt(prompt),
            sampling=_sampling(request, request.max_tokens),
            echo=bool(request.echo),
            created_at=created_at,
            n=request.n or 1,
            logprobs=request.logprobs,
            # Echo with logprobs scores the echoed prompt too, as OpenAI does.
            prompt_logprobs=request.logprobs if request.echo else None,
            constraint=constraint,
        )
        for index, prompt in enumerate(request.prompt)
    ]


def prompt_request_id(request_id: str, index: int, count: int) -> str:
    """The job id of prompt ``index``: the request's own id when it has one prompt."""
    return request_id if count == 1 else f"{request_id}-p{index}"


def check_choice_count(request: ChatCompletionRequest | CompletionRequest, max_n: int) -> None:
    """Refuse more choices than the operator allows (``max_n``)."""
    if request.n is not None and request.n > max_n:
        raise InvalidRequest(f"n must be at most {max_n} on this server; got {request.n}.", param="n")


def _check_best_of(request: CompletionRequest) -> None:
    if request.best_of is not None and request.best_of != (request.n or 1):
        raise InvalidRequest(
            "best_of is supported only equal to n (candidates are returned, never ranked away).",
            param="best_of",
        )


def _chat_logprobs(request: ChatCompletionRequest) -> int | None:
    if request.logprobs:
        return request.top_logprobs or 0
    if request.top_logprobs:
        raise InvalidRequest("top_logprobs needs logprobs set to true.", param="top_logprobs")
    return None


def _completion_prompt(prompt: str | list[int]) -> Prompt:
    return TextPrompt(text=prompt) if isinstance(prompt, str) else TokenPrompt(token_ids=prompt)


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
    meta = _meta(request, CHAT_ID_PREFIX + request_id, created_at)
    return replace(meta, legacy_functions=agent_translate.legacy_functions(request))


def completion_meta(request: CompletionRequest, request_id: str, created_at: float) -> ResponseMeta:
    meta = _meta(request, COMPLETION_ID_PREFIX + request_id, created_at)
    return replace(
        meta, echo=bool(request.echo), prompts=len(request.prompt), logprobs=request.logprobs is not None
    )


def _meta(
    request: ChatCompletionRequest | CompletionRequest, response_id: str, created_at: float
) -> ResponseMeta:
    """What chat and text completions share: id, time, model, choices, whether usage is streamed."""
    wants_usage = bool(request.stream and request.stream_options and request.stream_options.include_usage)
    return ResponseMeta(
        id=response_id,
        created=int(created_at),
        model=request.model,
        include_usage=wants_usage,
        n=request.n or 1,
    )


# Tokenize requests -> jobs


def tokenize_job(request: TokenizeRequest, request_id: str) -> TokenizeJob:
    """The job for POST /tokenize: a text prompt, or messages the worker renders first."""
    if (request.prompt is None) == (request.messages is None):
        raise InvalidRequest("Give either prompt or messages to tokenize.", param="prompt")
    if request.messages is not None:
        prompt: Prompt = ChatPrompt(
            messages=chat_messages(request.messages),
            add_generation_prompt=request.add_generation_prompt,
        )
        add_special_tokens = bool(request.add_special_tokens)
    else:
        prompt = TextPrompt(text=request.prompt or "")
        add_special_tokens = request.add_special_tokens is not False
    return TokenizeJob(
        request_id=request_id, model=request.model, prompt=prompt, add_special_tokens=add_special_tokens
    )


def detokenize_job(request: DetokenizeRequest, request_id: str) -> TokenizeJob:
    """The job for POST /detokenize: token ids the worker decodes."""
    if any(token < 0 for token in request.tokens):
        raise InvalidRequest("Token ids must be non-negative integers.", param="tokens")
    return TokenizeJob(
        request_id=request_id, model=request.model, prompt=TokenPrompt(token_ids=request.tokens)
    )


# Workers -> model list


def model_list(workers: Iterable[WorkerInfo]) -> ModelList:
    """One card per served name (a model's and its aliases', as vLLM lists them), however many
    workers serve it."""
    by_model: dict[str, list[WorkerInfo]] = {}
    for worker in workers:
        for name in worker.served_names:
            by_model.setdefault(name, []).append(worker)
    return ModelList(data=[_model_card(name, by_model[name]) for name in sorted(by_model)])


def _model_card(name: str, workers: Sequence[WorkerInfo]) -> ModelCard:
    return ModelCard(
        id=name,
        created=int(min(worker.started_at for worker in workers)),
        # The smallest window is the one every worker of the model can honour.
        max_model_len=min(worker.max_model_len for worker in workers),
    )
