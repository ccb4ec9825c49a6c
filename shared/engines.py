"""Owns what each worker engine can honour: the generation parameters it refuses, by name.

A worker advertises its engine and the parameters it refuses in its registry record
(``shared/registry.py``), so the gateway answers a request that needs one of them
with a 400 naming the parameter and the engine before queueing it, and the worker
refuses it again in preparation (a job enqueued before the record was read, a
batch line, a server default). A parameter left at its neutral value asks nothing
of the engine and is never refused: ``num_beams: 1`` runs anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from shared.errors import InvalidRequest

EngineName = Literal["transformers", "fake", "vllm"]

# The value at which each refusable parameter changes nothing (transformers' defaults).
NEUTRAL: Mapping[str, float] = {
    "num_beams": 1,
    "typical_p": 1.0,
    "length_penalty": 1.0,
    "no_repeat_ngram_size": 0,
}

# vLLM's sampler has no beams in its engine loop (its beam search is a client-side loop over
# the engine), no typical sampling and no n-gram blocking.
_REFUSED: Mapping[str, tuple[str, ...]] = {
    "transformers": (),
    "fake": (),
    "vllm": ("num_beams", "typical_p", "length_penalty", "no_repeat_ngram_size"),
}


def refused_by(engine: str) -> tuple[str, ...]:
    """The parameters ``engine`` cannot honour (none for an engine this build does not know)."""
    return _REFUSED.get(engine, ())


def first_refused(params: object, refused: Iterable[str]) -> str | None:
    """The first of ``refused`` that ``params`` (a request's spec or resolved parameters, read by
    attribute) sets to something other than its neutral value."""
    for name in refused:
        value = getattr(params, name, None)
        if value is not None and value != NEUTRAL.get(name):
            return name
    return None


def refuse(params: object, refused: Iterable[str], engine: str, model: str | None = None) -> None:
    """Raise a 400 naming the first parameter in ``params`` that ``engine`` cannot honour."""
    name = first_refused(params, refused)
    if name is not None:
        serving = f"the model `{model}`" if model else "this model"
        raise InvalidRequest(
            f"`{name}` is not supported by the {engine} engine serving {serving}; "
            f"leave it unset (or at {NEUTRAL[name]:g}), or send the request to a model served by the "
            "transformers engine.",
            param=name,
        )
