"""Owns what a request may ask of this worker: the model's and the operator's limits, and their checks.

Everything the engine will see is checked here, during preparation, so a bad value
is refused as the request's first event (a 400 naming the field, before any SSE
byte) instead of reaching a step. The engine does fail a sequence it cannot run
alone (``worker/engine/isolation.py``), but that is a last resort: the client gets
``worker_failed`` for its own mistake, the batch pays for the failed forward and
its retries, and on a GPU an id past the embedding is a device-side assert that
no retry survives. So the checks cover what the engine would choke on: prompt
ids outside the vocabulary, parameters a logits processor or ``torch`` refuses
(non-finite floats, ranges, seeds past 64 bits), ``logit_bias`` ids and values,
more alternatives than the vocabulary holds, and beam widths past the operator's
bound (beam search runs ``num_beams`` rows through ``model.generate`` at once, so
the bound is never above the batch size either).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared.errors import InvalidRequest
from worker.engine import SamplingParams

# OpenAI's bounds: beyond them a bias or penalty only overflows logits into inf and NaN.
MAX_LOGIT_BIAS = 100.0
MAX_PENALTY = 2.0
# A repetition penalty divides or multiplies logits: near 0 (1e-40 is 0 in float32) it makes
# several of them +inf, and sampling from inf - inf is NaN. 1 is no penalty; usual values are 1-2.
REPETITION_PENALTY_RANGE = (0.01, 100.0)
# torch.Generator.manual_seed takes a 64-bit seed; the gateway's bound is the signed range.
SEED_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class ModelLimits:
    max_model_len: int
    eos_token_ids: frozenset[int]
    vocab_size: int
    # The widest beam search a request may ask for (the operator's bound, at most the batch size).
    max_num_beams: int
    # The engine, and the parameters it cannot honour (``shared/engines.py``).
    engine: str = "transformers"
    engine_refuses: tuple[str, ...] = ()


# (field of SamplingParams, the request's name for it, the test its value must pass, what it must be)
_Rule = tuple[str, str, Callable[[float], bool], str]
_RULES: tuple[_Rule, ...] = (
    ("temperature", "temperature", lambda v: v >= 0, "at least 0"),
    ("top_p", "top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("typical_p", "typical_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("min_p", "min_p", lambda v: 0 <= v <= 1, "in [0, 1]"),
    (
        "repetition_penalty",
        "repetition_penalty",
        lambda v: REPETITION_PENALTY_RANGE[0] <= v <= REPETITION_PENALTY_RANGE[1],
        "in [0.01, 100]",
    ),
    ("presence_penalty", "presence_penalty", lambda v: abs(v) <= MAX_PENALTY, "in [-2, 2]"),
    ("frequency_penalty", "frequency_penalty", lambda v: abs(v) <= MAX_PENALTY, "in [-2, 2]"),
    ("length_penalty", "length_penalty", lambda v: True, "a number"),
    ("no_repeat_ngram_size", "no_repeat_ngram_size", lambda v: v >= 0, "at least 0"),
    ("min_new_tokens", "min_tokens", lambda v: v >= 0, "at least 0"),
)


def check_prompt_ids(token_ids: Sequence[int], limits: ModelLimits, param: str) -> None:
    """Every id must be one the model's embedding has."""
    if not token_ids or (min(token_ids) >= 0 and max(token_ids) < limits.vocab_size):
        return  # min and max run in C: a generator over a long prompt cost ~3 % of a request's CPU
    bad = next((token for token in token_ids if not 0 <= token < limits.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            f"Token id {bad} is outside the model's vocabulary: ids must be in [0, {limits.vocab_size}).",
            param=param,
        )


def check_alternatives(top: int | None, limits: ModelLimits, param: str) -> None:
    """Alternatives per token (logprobs) cannot outnumber the vocabulary."""
    if top is not None and top > limits.vocab_size:
        raise InvalidRequest(f"{param} must be at most the vocabulary size {limits.vocab_size}", param=param)


def check_params(params: SamplingParams, limits: ModelLimits) -> None:
    """Refuse every resolved parameter the engine could not take."""
    for field, param, passes, bound in _RULES:
        value = getattr(params, field)
        # isfinite only on floats: an int too large for a float would raise instead of answering.
        if (isinstance(value, float) and not math.isfinite(value)) or not passes(value):
            raise InvalidRequest(f"{param} must be {bound}, not {value}", param=param)
    _check_logit_bias(params, limits)
    if not 1 <= params.num_beams <= limits.max_num_beams:
        raise InvalidRequest(
            f"num_beams must be between 1 and {limits.max_num_beams} on this server", param="num_beams"
        )
    if params.seed is not None and not SEED_RANGE[0] <= params.seed <= SEED_RANGE[1]:
        raise InvalidRequest("seed must fit in a signed 64-bit integer", param="seed")


def check_max_tokens(max_new_tokens: int, requested_min: int | None) -> None:
    """At least one token, and no fewer than the request's own minimum."""
    if max_new_tokens < 1:
        raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
    if requested_min is not None and requested_min > max_new_tokens:
        raise InvalidRequest(
            f"min_tokens ({requested_min}) must not exceed max_tokens ({max_new_tokens})", param="min_tokens"
        )


def _check_logit_bias(params: SamplingParams, limits: ModelLimits) -> None:
    for token, bias in params.logit_bias:
        if not 0 <= token < limits.vocab_size:
            raise InvalidRequest(
                f"logit_bias token ids must be below the vocabulary size {limits.vocab_size}",
                param="logit_bias",
            )
        if not (math.isfinite(bias) and abs(bias) <= MAX_LOGIT_BIAS):
            raise InvalidRequest("logit_bias values must be in [-100, 100]", param="logit_bias")
