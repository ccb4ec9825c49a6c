"""Owns turning a job's sampling spec into an ``EngineRequest``: precedence, defaults, limits.

Precedence (see ``shared/settings.py``): request > server settings > the model's
``generation_config.json`` > library defaults. Each layer is a ``SamplingSpec``
whose ``None`` fields mean "not set here", so merging is first-non-None per field.
The resolved parameters are checked against the model in ``limits.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shared import engines
from shared.errors import ContextLengthExceeded
from shared.protocol import SamplingSpec
from worker.engine import EngineRequest, SamplingParams
from worker.requests.limits import ModelLimits, check_max_tokens, check_params

_T = TypeVar("_T")

# vLLM's floor: below it, logits divided by the temperature overflow into inf and NaN.
MIN_TEMPERATURE = 0.01


def merge_specs(*layers: SamplingSpec) -> SamplingSpec:
    """First non-None value of each field, highest-precedence layer first."""
    merged: dict[str, Any] = {}
    for name in SamplingSpec.model_fields:
        merged[name] = next((value for layer in layers if (value := getattr(layer, name)) is not None), None)
    return SamplingSpec(**merged)


def spec_from_generation_config(config: dict[str, Any]) -> SamplingSpec:
    """The model's own defaults, from the fields its generation_config.json actually sets."""
    do_sample = config.get("do_sample")
    temperature = config.get("temperature")
    if do_sample is False:
        temperature = 0.0
    elif do_sample is True and temperature is None:
        temperature = 1.0
    elif do_sample is None:
        # transformers samples only when do_sample is set: a lone temperature means greedy.
        temperature = None if temperature is None else 0.0
    return SamplingSpec(
        max_tokens=config.get("max_new_tokens"),
        temperature=temperature,
        top_p=config.get("top_p"),
        top_k=config.get("top_k"),
        typical_p=config.get("typical_p"),
        min_p=config.get("min_p"),
        repetition_penalty=config.get("repetition_penalty"),
        length_penalty=config.get("length_penalty"),
        no_repeat_ngram_size=config.get("no_repeat_ngram_size"),
        num_beams=config.get("num_beams"),
        min_tokens=config.get("min_new_tokens"),
    )


def to_sampling_params(spec: SamplingSpec) -> SamplingParams:
    """Concrete engine parameters; library defaults fill what no layer set."""
    top_k = spec.top_k or 0
    temperature = _or(spec.temperature, 0.0)
    return SamplingParams(
        temperature=MIN_TEMPERATURE if 0 < temperature < MIN_TEMPERATURE else temperature,
        top_p=_or(spec.top_p, 1.0),
        top_k=max(top_k, 0),  # -1 and 0 both disable, as in vLLM
        typical_p=_or(spec.typical_p, 1.0),
        min_p=_or(spec.min_p, 0.0),
        repetition_penalty=_or(spec.repetition_penalty, 1.0),
        presence_penalty=_or(spec.presence_penalty, 0.0),
        frequency_penalty=_or(spec.frequency_penalty, 0.0),
        length_penalty=_or(spec.length_penalty, 1.0),
        no_repeat_ngram_size=_or(spec.no_repeat_ngram_size, 0),
        num_beams=_or(spec.num_beams, 1),
        min_new_tokens=_or(spec.min_tokens, 0),
        seed=spec.seed,
        logit_bias=tuple(sorted((spec.logit_bias or {}).items())),
    )


def resolve_max_tokens(
    requested: int | None, fallback: int | None, prompt_tokens: int, limits: ModelLimits
) -> int:
    """Tokens to generate; an explicit request beyond the context window is an error, as in OpenAI."""
    room = limits.max_model_len - prompt_tokens
    if room <= 0 or (requested is not None and requested > room):
        wanted = requested if requested is not None else 1
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, you requested "
            f"{prompt_tokens + wanted} tokens ({prompt_tokens} in the messages, {wanted} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="messages",
        )
    if requested is not None:
        return requested
    return room if fallback is None else min(fallback, room)


@dataclass(frozen=True, slots=True)
class DefaultLayers:
    """The layers below the request: the operator's settings, then the model's generation config."""

    server: SamplingSpec
    model: SamplingSpec

    def under(self, request: SamplingSpec) -> SamplingSpec:
        return merge_specs(request, self.server, self.model)


def build_engine_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    request: SamplingSpec,
    defaults: DefaultLayers,
    limits: ModelLimits,
) -> EngineRequest:
    """Resolve the request's parameters over the defaults and check them against the model."""
    spec = defaults.under(request)
    params = to_sampling_params(spec)
    check_params(params, limits)
    # Resolved values: a server default or the model's generation config may ask it too.
    engines.refuse(params, limits.engine_refuses, limits.engine)
    fallback_max_tokens = merge_specs(defaults.server, defaults.model).max_tokens
    max_new_tokens = resolve_max_tokens(
        request.max_tokens, fallback_max_tokens, len(prompt_token_ids), limits
    )
    check_max_tokens(max_new_tokens, request.min_tokens)
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=tuple(prompt_token_ids),
        sampling=params,
        max_new_tokens=max_new_tokens,
        eos_token_ids=frozenset() if spec.ignore_eos else limits.eos_token_ids,
    )


def _or(value: _T | None, default: _T) -> _T:
    return default if value is None else value
