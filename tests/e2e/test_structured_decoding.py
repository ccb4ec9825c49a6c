"""Constrained decoding with the real model: what the batched engine generates matches the job's constraint.

Engine level, no servers: jobs go through the worker's own ``prepare`` (template, tokens,
constraint compiled for the model's vocabulary) into a ``TransformersEngine``, and the
output is checked as a client would check it (``json.loads`` and ``jsonschema``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

from shared.errors import InvalidRequest
from shared.protocol import (
    ChatMessage,
    ChatPrompt,
    ChoiceConstraint,
    Constraint,
    FinishReason,
    FunctionTool,
    GenerationJob,
    GrammarConstraint,
    JsonConstraint,
    RegexConstraint,
    SamplingSpec,
    ToolChoice,
)
from shared.settings import WorkerSettings
from tests.e2e.structured_schemas import SCHEMAS
from worker.engine import EngineRequest
from worker.engine.grammar import GrammarCompiler
from worker.engine.hf import TransformersEngine
from worker.engine.scheduler import BatchLimits
from worker.requests.limits import ModelLimits
from worker.requests.params import DefaultLayers
from worker.requests.preparation import prepare
from worker.requests.tokenization import HFTokenizer

if TYPE_CHECKING:
    from worker.model.loading import LoadedModel

# Generous: these run the real model on 2 busy cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EOS = 2  # SmolLM2's <|im_end|>
WEATHER = FunctionTool(
    name="get_weather",
    description="The weather in a city.",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
TIME = FunctionTool(
    name="get_time",
    parameters={
        "type": "object",
        "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]{2,10}/[A-Z][a-z]{2,10}$"}},
        "required": ["timezone"],
        "additionalProperties": False,
    },
)


@dataclasses.dataclass
class Outcome:
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    failed: bool = False


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    from worker.model.loading import load_model

    return load_model(WorkerSettings())


@pytest.fixture(scope="module")
def loaded_fp32() -> LoadedModel:
    """float32: a row's tokens are independent of its batch only there (tests/e2e/conftest.py)."""
    from worker.model.loading import load_model

    return load_model(WorkerSettings(dtype="float32"))


@pytest.fixture(scope="module")
def tokenizer(loaded: LoadedModel) -> HFTokenizer:
    return HFTokenizer(loaded.tokenizer, extra_eos_ids=[EOS])


@pytest.fixture
def grammars(loaded: LoadedModel, tokenizer: HFTokenizer) -> GrammarCompiler:
    vocab = int(loaded.model.config.vocab_size)
    return GrammarCompiler.for_hf_tokenizer(loaded.tokenizer, vocab, tokenizer.eos_token_ids)


def job(
    request_id: str,
    question: str,
    constraint: Constraint | None = None,
    max_tokens: int = 160,
    tools: list[FunctionTool] | None = None,
    tool_choice: ToolChoice | None = None,
    **sampling: Any,
) -> GenerationJob:
    return GenerationJob(
        request_id=request_id,
        model="smollm2",
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content=question)], tools=tools),
        sampling=SamplingSpec(max_tokens=max_tokens, **sampling),
        created_at=time.time(),
        constraint=constraint,
        tool_choice=tool_choice,
    )


def prepared(
    generation: GenerationJob, tokenizer: HFTokenizer, grammars: GrammarCompiler, vocab: int = 49152
) -> EngineRequest:
    """The engine request the worker would run for ``generation``."""
    limits = ModelLimits(2048, tokenizer.eos_token_ids, vocab, max_num_beams=4)
    defaults = DefaultLayers(SamplingSpec(), SamplingSpec())
    return prepare(generation, tokenizer, defaults, limits, grammars=grammars).engine_request


def run(loaded: LoadedModel, requests: Sequence[EngineRequest], batch: int = 64) -> dict[str, Outcome]:
    engine = TransformersEngine(loaded.model, BatchLimits(max_batch_size=batch))
    outcomes = {request.request_id: Outcome([]) for request in requests}
    for request in requests:
        engine.add(request)
    while engine.has_unfinished():
        for update in engine.step():
            outcome = outcomes[update.request_id]
            outcome.token_ids += update.new_token_ids
            outcome.finish_reason = update.finish_reason or outcome.finish_reason
            outcome.failed = outcome.failed or update.failed
    return outcomes


def text(tokenizer: HFTokenizer, outcome: Outcome) -> str:
    return tokenizer.decode(outcome.token_ids)


def ask_for(schema: dict[str, Any]) -> str:
    return f"Reply with a JSON value for this JSON schema, nothing else: {json.dumps(schema)}"


def test_fifty_schemas_in_one_batch_beside_free_rows_all_validate_and_free_rows_are_unchanged(
    loaded: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    constrained = [
        prepared(job(f"s{i}", ask_for(schema), JsonConstraint(json_schema=schema)), tokenizer, grammars)
        for i, schema in enumerate(SCHEMAS)
    ]
    free = [
        prepared(job(f"free{i}", question, max_tokens=24), tokenizer, grammars)
        for i, question in enumerate(
            ["What is the capital of France?", "List three colors.", "Who wrote Hamlet?"]
        )
    ]
    together = run(loaded, [*constrained[:25], *free, *constrained[25:]])
    for index, schema in enumerate(SCHEMAS):
        outcome = together[f"s{index}"]
        assert outcome.finish_reason is FinishReason.STOP, (index, text(tokenizer, outcome))
        jsonschema.validate(json.loads(text(tokenizer, outcome)), schema)
    alone = run(loaded, free)
    assert {r.request_id: together[r.request_id].token_ids for r in free} == {
        r.request_id: alone[r.request_id].token_ids for r in free
    }


def test_regex_choice_and_grammar_constraints_are_matched_exactly(
    loaded: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    lark = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,3}/'
    gbnf = 'root ::= ("yes" | "no") " because " [a-z ]{1,20} "."'
    requests = [
        prepared(
            job("regex", "Give a product code.", RegexConstraint(pattern=r"[A-Z]{2}-\d{4}")),
            tokenizer,
            grammars,
        ),
        prepared(
            job("choice", "Is the sky blue?", ChoiceConstraint(choices=["yes", "no", "maybe"])),
            tokenizer,
            grammars,
        ),
        prepared(job("lark", "What is 2+2?", GrammarConstraint(grammar=lark)), tokenizer, grammars),
        prepared(job("gbnf", "Is water wet?", GrammarConstraint(grammar=gbnf)), tokenizer, grammars),
    ]
    outcomes = run(loaded, requests)
    assert all(outcome.finish_reason is FinishReason.STOP for outcome in outcomes.values())
    assert re.fullmatch(r"[A-Z]{2}-\d{4}", text(tokenizer, outcomes["regex"]))
    assert text(tokenizer, outcomes["choice"]) in {"yes", "no", "maybe"}
    assert re.fullmatch(r"The answer is [0-9]{1,3}\.", text(tokenizer, outcomes["lark"]))
    assert re.fullmatch(r"(yes|no) because [a-z ]{1,20}\.", text(tokenizer, outcomes["gbnf"]))


def test_required_tool_choice_yields_calls_of_the_tools_whose_arguments_validate(
    loaded: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    tools = [WEATHER, TIME]
    requests = [
        prepared(
            job(
                f"required{parallel}",
                "What's the weather in Paris?",
                tools=tools,
                tool_choice=ToolChoice(mode="required", parallel=parallel),
            ),
            tokenizer,
            grammars,
        )
        for parallel in (False, True)
    ]
    outcomes = run(loaded, requests)
    by_name = {tool.name: tool.parameters for tool in tools}
    for parallel in (False, True):
        outcome = outcomes[f"required{parallel}"]
        assert outcome.finish_reason is FinishReason.STOP
        calls = json.loads(text(tokenizer, outcome))
        assert 1 <= len(calls) <= (len(calls) if parallel else 1)
        for call in calls:
            jsonschema.validate(call["arguments"], by_name[call["name"]])


def test_a_named_tool_choice_yields_that_functions_arguments(
    loaded: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    request = prepared(
        job(
            "named",
            "What time is it in Tokyo?",
            tools=[WEATHER, TIME],
            tool_choice=ToolChoice(mode="named", name="get_time"),
        ),
        tokenizer,
        grammars,
    )
    outcome = run(loaded, [request])["named"]
    assert outcome.finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(text(tokenizer, outcome)), TIME.parameters)


def test_a_cut_by_max_tokens_stays_length_and_a_complete_grammar_stops_despite_min_tokens_and_ignore_eos(
    loaded: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    schema = SCHEMAS[1]
    choice = ChoiceConstraint(choices=["yes", "no"])
    requests = [
        prepared(
            job("cut", ask_for(schema), JsonConstraint(json_schema=schema), max_tokens=5), tokenizer, grammars
        ),
        prepared(job("min", "Is the sky blue?", choice, min_tokens=50), tokenizer, grammars),
        prepared(job("ignore", "Is the sky blue?", choice, ignore_eos=True), tokenizer, grammars),
        prepared(
            job("sampled", "Is the sky blue?", choice, min_tokens=50, temperature=1.0, seed=3),
            tokenizer,
            grammars,
        ),
    ]
    outcomes = run(loaded, requests)
    assert (outcomes["cut"].finish_reason, len(outcomes["cut"].token_ids)) == (FinishReason.LENGTH, 5)
    for request_id in ("min", "ignore", "sampled"):
        assert outcomes[request_id].finish_reason is FinishReason.STOP
        assert text(tokenizer, outcomes[request_id]) in {"yes", "no"}


def test_seeded_constrained_sampling_is_the_same_alone_and_in_a_batch(
    loaded_fp32: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    schema = SCHEMAS[0]
    seeded = prepared(
        job("seeded", ask_for(schema), JsonConstraint(json_schema=schema), temperature=0.9, seed=7),
        tokenizer,
        grammars,
    )
    others = [
        prepared(job(f"o{i}", ask_for(s), JsonConstraint(json_schema=s)), tokenizer, grammars)
        for i, s in enumerate(SCHEMAS[2:6])
    ]
    alone = run(loaded_fp32, [seeded])["seeded"]
    together = run(loaded_fp32, [*others, seeded])["seeded"]
    assert together.token_ids == alone.token_ids
    jsonschema.validate(json.loads(text(tokenizer, alone)), schema)


def test_a_taken_over_sequence_continues_its_grammar_where_the_dead_run_stopped(
    loaded: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    schema = SCHEMAS[11]
    request = prepared(job("first", ask_for(schema), JsonConstraint(json_schema=schema)), tokenizer, grammars)
    whole = run(loaded, [request])["first"]
    streamed = whole.token_ids[:6]
    resumed = dataclasses.replace(
        request,
        request_id="resumed",
        prompt_token_ids=request.prompt_token_ids + tuple(streamed),
        resumed_tokens=len(streamed),
    )
    # Tokens the grammar refuses (a run that was not constrained): that takeover fails alone.
    broken = dataclasses.replace(
        resumed, request_id="broken", prompt_token_ids=request.prompt_token_ids + (EOS, EOS), resumed_tokens=2
    )
    outcomes = run(loaded, [resumed, broken])
    rest = outcomes["resumed"]
    assert rest.finish_reason is FinishReason.STOP
    assert streamed + rest.token_ids == whole.token_ids
    jsonschema.validate(json.loads(tokenizer.decode(streamed + rest.token_ids)), schema)
    assert outcomes["broken"].failed and outcomes["broken"].token_ids == []


def test_what_cannot_be_enforced_is_an_invalid_request_naming_its_parameter(
    tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    cases = [
        (job("lark", "hi", GrammarConstraint(grammar="start: foo\nfoo: bar")), "structured_outputs.grammar"),
        (job("beams", "hi", JsonConstraint(json_schema=SCHEMAS[0]), num_beams=2), "response_format"),
        (
            job("both", "hi", JsonConstraint(), tools=[WEATHER], tool_choice=ToolChoice(mode="required")),
            "response_format",
        ),
    ]
    for generation, param in cases:
        with pytest.raises(InvalidRequest) as refused:
            prepared(generation, tokenizer, grammars)
        assert refused.value.param == param
    unavailable = GrammarCompiler.unavailable_because("no grammar support here")
    with pytest.raises(InvalidRequest) as refused:
        prepared(job("x", "hi", RegexConstraint(pattern="a+")), tokenizer, unavailable)
    assert refused.value.param == "structured_outputs.regex"


def test_the_same_grammar_compiles_once_and_every_sequence_gets_its_own_matcher(
    loaded: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    schema = SCHEMAS[4]
    first = prepared(job("a", ask_for(schema), JsonConstraint(json_schema=schema)), tokenizer, grammars)
    second = prepared(job("b", ask_for(schema), JsonConstraint(json_schema=schema)), tokenizer, grammars)
    assert grammars.compiles == 1
    assert first.grammar is second.grammar
    outcomes = run(loaded, [first, second])
    assert outcomes["a"].token_ids == outcomes["b"].token_ids  # neither matcher saw the other's tokens
    jsonschema.validate(json.loads(text(tokenizer, outcomes["a"])), schema)


def test_logprobs_of_constrained_tokens_are_the_models_raw_ones_not_the_masked_distributions(
    loaded: LoadedModel, tokenizer: HFTokenizer, grammars: GrammarCompiler
) -> None:
    import torch

    schema = SCHEMAS[2]
    request = dataclasses.replace(
        prepared(
            job("scored", ask_for(schema), JsonConstraint(json_schema=schema), max_tokens=4),
            tokenizer,
            grammars,
        ),
        logprobs=0,
    )
    engine = TransformersEngine(loaded.model, BatchLimits())
    engine.add(request)
    first = next(update for update in engine.step() if update.request_id == "scored")
    assert first.logprobs is not None
    (score,) = first.logprobs
    with torch.inference_mode():
        logits = loaded.model(input_ids=torch.tensor([request.prompt_token_ids])).logits[0, -1]
    raw = float(torch.log_softmax(logits.float(), dim=-1)[score.token_id])
    # Only the object's opening is allowed here: scored after masking, near 0; raw, the model's own.
    assert score.logprob == pytest.approx(raw, abs=1e-3)
    assert score.logprob < -1e-4
    engine.close()


def test_a_workers_backend_warms_its_grammars_up_when_asked_and_the_per_sequence_engine_refuses_constraints(
    tokenizer: HFTokenizer,
) -> None:
    from worker.model.backend import load_backend
    from worker.model.warmup import warm_up

    compiled: list[float] = []
    settings = WorkerSettings(grammar_tables_at_start=True)
    backend = load_backend(settings, on_grammar_compile=compiled.append)
    assert backend.grammars is not None
    warm_up(backend)  # a constrained generation: the grammar's compile and first masks are paid here
    assert len(compiled) == 1 and backend.grammars.compiles == 1
    request = prepared(job("w", "hi", RegexConstraint(pattern="[a-z]{3}")), tokenizer, backend.grammars)
    assert request.grammar is not None and len(compiled) == 2
    sequential = load_backend(WorkerSettings(disable_kv_cache=True))
    assert sequential.grammars is not None
    with pytest.raises(InvalidRequest, match="batched engine") as refused:
        prepared(job("s", "hi", RegexConstraint(pattern="[a-z]{3}")), tokenizer, sequential.grammars)
    assert refused.value.param == "structured_outputs.regex"


def test_the_vocabulary_tables_are_built_by_the_first_constrained_job_unless_asked_at_start(
    loaded: LoadedModel, tokenizer: HFTokenizer
) -> None:
    vocab = int(loaded.model.config.vocab_size)
    lazy = GrammarCompiler.for_hf_tokenizer(loaded.tokenizer, vocab, tokenizer.eos_token_ids)
    assert lazy.warm_up() is None and lazy.compiles == 0  # nothing built: a worker's warm-up runs free text
    first = prepared(job("a", "hi", RegexConstraint(pattern="[a-z]{3}")), tokenizer, lazy)
    assert first.grammar is not None and lazy.compiles == 1  # built here, then compiled
    assert lazy.warm_up() is not None  # from now on as if built at start
    eager = GrammarCompiler.for_hf_tokenizer(loaded.tokenizer, vocab, tokenizer.eos_token_ids, at_start=True)
    assert eager.warm_up() is not None and eager.compiles == 1
