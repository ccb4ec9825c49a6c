"""Owns preparing a job: rendering and tokenizing its prompt and resolving it into an ``EngineRequest``.

Only the worker knows the tokenizer, the chat template, the vocabulary and the context
window, so the errors found here (prompt too long, an id outside the vocabulary, bad
template input, a parameter the engine cannot take: ``limits.py``) travel back as the
request's first event and the gateway answers them before any SSE byte.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from shared.errors import InvalidRequest
from shared.protocol import ChatPrompt, GenerationJob, TextPrompt, TokenPrompt
from worker.engine import EngineRequest
from worker.engine.grammar import GrammarCompiler
from worker.requests.chat_input import render_prompt
from worker.requests.chat_options import ChatOptions
from worker.requests.choices import choice_requests
from worker.requests.constraints import constrain
from worker.requests.limits import ModelLimits, check_alternatives, check_prompt_ids
from worker.requests.output_parsing import OutputParsing
from worker.requests.params import DefaultLayers, build_engine_request
from worker.requests.thinking import closes_thinking, thinking_markers
from worker.requests.tokenization import Tokenizer

logger = logging.getLogger(__name__)

NO_CHAT_OPTIONS = ChatOptions()
NO_PARSING = OutputParsing()
INTERACTIVE_PRIORITY = 0
BATCH_PRIORITY = 1


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    # One engine request per choice, in choice order (see ``worker/requests/choices.py``).
    engine_requests: tuple[EngineRequest, ...]
    stop_sequences: tuple[str, ...]
    # The prompt as the client should see it echoed, when the job asked for echo.
    echo_text: str | None
    # How the choices' text is parsed: reasoning, tool calls.
    parsing: OutputParsing = NO_PARSING

    @property
    def engine_request(self) -> EngineRequest:
        """Choice 0's request, whose engine id is the request id."""
        return self.engine_requests[0]


def prepare(
    job: GenerationJob,
    tokenizer: Tokenizer,
    defaults: DefaultLayers,
    limits: ModelLimits,
    chat: ChatOptions = NO_CHAT_OPTIONS,
    grammars: GrammarCompiler | None = None,
) -> PreparedRequest:
    """Tokenize the prompt and resolve parameters; raises ``TokenferryError`` subclasses."""
    rendered = (
        render_prompt(tokenizer, job.prompt, chat.template_kwargs)
        if isinstance(job.prompt, ChatPrompt)
        else None
    )
    prompt_ids = _prompt_token_ids(job, tokenizer, rendered)
    if not prompt_ids:
        # Nothing to condition on: the model would be run on an empty batch row (vLLM's 400 too).
        raise InvalidRequest("The prompt is empty: it must have at least one token.", param="prompt")
    # Text prompts too: a tokenizer may know ids (added tokens) that the model's embedding lacks.
    check_prompt_ids(prompt_ids, limits, "messages" if isinstance(job.prompt, ChatPrompt) else "prompt")
    check_alternatives(job.logprobs, limits, "logprobs")
    check_alternatives(job.prompt_logprobs, limits, "logprobs")
    engine_request = build_engine_request(job.request_id, prompt_ids, job.sampling, defaults, limits)
    _check_choices(job, engine_request)
    markers = thinking_markers(tokenizer, chat.reasoning, prompt_ids)
    engine_request = constrain(engine_request, job, grammars, markers)
    engine_request = dataclasses.replace(
        engine_request,
        logprobs=job.logprobs,
        prompt_logprobs=job.prompt_logprobs,
        priority=BATCH_PRIORITY if job.lane == "batch" else INTERACTIVE_PRIORITY,
    )
    stops = defaults.under(job.sampling).stop or []
    # Opt-in only (--log-level DEBUG): the prompt is user data and never logged at INFO.
    logger.debug("prompt token ids %s text %r", prompt_ids, tokenizer.decode(prompt_ids))
    return PreparedRequest(
        engine_requests=choice_requests(engine_request, job.n),
        stop_sequences=tuple(stop for stop in stops if stop),
        echo_text=_echo_text(job, prompt_ids, tokenizer, rendered) if job.echo else None,
        parsing=OutputParsing.of(
            job,
            chat.call_format,
            chat.reasoning,
            thought=closes_thinking(tokenizer, chat.reasoning, prompt_ids),
        ),
    )


def _check_choices(job: GenerationJob, request: EngineRequest) -> None:
    """Beam search returns one sequence, without per-token scores: refuse what it cannot give."""
    if request.sampling.num_beams == 1:
        return
    if job.n > 1:
        raise InvalidRequest("n greater than 1 cannot be combined with beam search (num_beams).", param="n")
    if job.logprobs is not None or job.prompt_logprobs is not None:
        raise InvalidRequest("logprobs cannot be combined with beam search (num_beams).", param="logprobs")


def _prompt_token_ids(job: GenerationJob, tokenizer: Tokenizer, rendered: str | None) -> list[int]:
    prompt = job.prompt
    if isinstance(prompt, TokenPrompt):
        return list(prompt.token_ids)
    if isinstance(prompt, TextPrompt):
        return tokenizer.encode(prompt.text, add_special_tokens=True)
    # The template already wrote every special token the model expects.
    return tokenizer.encode(rendered or "", add_special_tokens=False)


def _echo_text(job: GenerationJob, prompt_ids: list[int], tokenizer: Tokenizer, rendered: str | None) -> str:
    prompt = job.prompt
    if isinstance(prompt, TextPrompt):
        return prompt.text
    if rendered is not None:
        return rendered
    return tokenizer.decode(prompt_ids)
