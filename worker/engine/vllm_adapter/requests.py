"""Owns the translation of an ``EngineRequest`` into vLLM's prompt and ``SamplingParams``.

Resolution is tokenferry's (``worker/requests/params.py``): every value here is
concrete, and vLLM's own defaults (its generation-config layer included) never
apply. End-of-sequence is ours too: ``ignore_eos`` always, and the request's EOS set
passed as ``stop_token_ids``, so an ``ignore_eos`` request (an empty set) and one
with extra stop ids behave as on the native engine. Tokens stay ids: vLLM neither
detokenizes nor matches stop strings (the driver does both, identically for every
engine). A resumed request (a takeover) carries its earlier output in its prompt,
so its token budgets shrink by that much.

Grammars: the job's constraint was compiled by ``worker/engine/grammar.py`` into an
llguidance grammar (its checks and its 400s are the same on every engine); vLLM gets
the same grammar as Lark text for its ``guidance`` backend, which is llguidance too.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from worker.engine import EngineRequest, output_start

if TYPE_CHECKING:
    from vllm import SamplingParams as VllmSamplingParams


def prompt_of(request: EngineRequest) -> dict[str, Any]:
    """vLLM's ``TokensPrompt``: the ids as they are (the chat template was applied already)."""
    return {"prompt_token_ids": list(request.prompt_token_ids)}


def sampling_params_of(request: EngineRequest, model_eos: frozenset[int]) -> VllmSamplingParams:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    sampling = request.sampling
    produced = len(request.prompt_token_ids) - output_start(request)  # resumed tokens: output already
    stop_ids = set(request.eos_token_ids)
    structured = None
    if request.grammar is not None:
        structured = StructuredOutputsParams(grammar=lark_of(request.grammar.text))
        # A complete grammar allows only EOS: it must end the sequence even under ignore_eos.
        stop_ids |= model_eos
    return SamplingParams(
        n=1,  # choices are separate engine requests (``worker/driver/routing.py``)
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        repetition_penalty=sampling.repetition_penalty,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        seed=sampling.seed,
        logit_bias=dict(sampling.logit_bias) or None,
        max_tokens=max(1, request.max_new_tokens - produced),
        min_tokens=max(0, sampling.min_new_tokens - produced),
        ignore_eos=True,
        stop_token_ids=sorted(stop_ids),
        logprobs=request.logprobs,
        prompt_logprobs=request.prompt_logprobs,
        detokenize=False,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.DELTA,
        structured_outputs=structured,
    )


def lark_of(grammar: str) -> str:
    """An llguidance grammar (its JSON form, as ``shared/structured`` writes it) as Lark text.

    Every grammar tokenferry writes is one Lark grammar or one JSON schema; a schema
    becomes Lark's ``%json`` rule, its ``x-guidance`` options kept.
    """
    top = json.loads(grammar)
    (only,) = top["grammars"]
    if only.get("lark_grammar"):
        return str(only["lark_grammar"])
    return "start: %json " + json.dumps(only["json_schema"])
