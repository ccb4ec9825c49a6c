"""Owns admitting a job: rendering and tokenizing its prompt and resolving it into an ``EngineRequest``.

Only the worker knows the tokenizer, the chat template and the context window, so
the errors found here (prompt too long, bad template input) travel back as the
request's first event and the gateway answers them before any SSE byte.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shared.protocol import ChatPrompt, GenerationJob, TextPrompt, TokenPrompt
from worker.engine import EngineRequest
from worker.params import DefaultLayers, ModelLimits, build_engine_request
from worker.tokenization import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AdmittedRequest:
    engine_request: EngineRequest
    stop_sequences: tuple[str, ...]
    # The prompt as the client should see it echoed, when the job asked for echo.
    echo_text: str | None


def admit(
    job: GenerationJob, tokenizer: Tokenizer, defaults: DefaultLayers, limits: ModelLimits
) -> AdmittedRequest:
    """Tokenize the prompt and resolve parameters; raises ``TokenferryError`` subclasses."""
    prompt_ids = _prompt_token_ids(job, tokenizer)
    engine_request = build_engine_request(job.request_id, prompt_ids, job.sampling, defaults, limits)
    stops = defaults.under(job.sampling).stop or []
    logger.debug("prompt token ids %s text %r", prompt_ids, tokenizer.decode(prompt_ids))
    return AdmittedRequest(
        engine_request=engine_request,
        stop_sequences=tuple(stop for stop in stops if stop),
        echo_text=_echo_text(job, prompt_ids, tokenizer) if job.echo else None,
    )


def _prompt_token_ids(job: GenerationJob, tokenizer: Tokenizer) -> list[int]:
    prompt = job.prompt
    if isinstance(prompt, TokenPrompt):
        return list(prompt.token_ids)
    if isinstance(prompt, TextPrompt):
        return tokenizer.encode(prompt.text, add_special_tokens=True)
    rendered = tokenizer.render_chat(prompt.messages, add_generation_prompt=prompt.add_generation_prompt)
    # The template already wrote every special token the model expects.
    return tokenizer.encode(rendered, add_special_tokens=False)


def _echo_text(job: GenerationJob, prompt_ids: list[int], tokenizer: Tokenizer) -> str:
    prompt = job.prompt
    if isinstance(prompt, TextPrompt):
        return prompt.text
    if isinstance(prompt, ChatPrompt):
        return tokenizer.render_chat(prompt.messages, add_generation_prompt=prompt.add_generation_prompt)
    return tokenizer.decode(prompt_ids)
