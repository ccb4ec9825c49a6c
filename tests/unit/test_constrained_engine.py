"""Grammars in the batched engine on the tiny model: masked rows match, their neighbours stay unchanged.

The tiny Llama's 128 ids are read as bytes by a byte-level llguidance tokenizer (id 127 is
its EOS), so its random weights generate whatever the grammar leaves them.
"""

from __future__ import annotations

import dataclasses
import re

import llguidance
import pytest
from transformers import LlamaForCausalLM

from shared.protocol import ChoiceConstraint, FinishReason, RegexConstraint
from shared.structured.grammars import grammar_for
from tests.engines import VOCAB, batched_engine, request, run_to_end, run_with_failures, tiny_llama
from worker.engine import EngineRequest, SequenceUpdate
from worker.engine.grammar import CompiledGrammar, GrammarCompiler

EOS = VOCAB - 1


class _Bytes:
    """What ``llguidance.TokenizerWrapper`` reads: id i is byte i, the last id is EOS."""

    def __init__(self) -> None:
        self.eos_token_id = EOS
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(EOS)] + [b"<eos>"]
        self.special_token_ids = [EOS]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture
def grammars() -> GrammarCompiler:
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), n_vocab=VOCAB)
    return GrammarCompiler(tokenizer)


def constrained(
    request_id: str, pattern: str, grammars: GrammarCompiler, **sampling: object
) -> EngineRequest:
    grammar = grammars.compile(grammar_for(RegexConstraint(pattern=pattern)), "structured_outputs.regex")
    return dataclasses.replace(request(request_id, [5, 6, 7], max_new_tokens=20, **sampling), grammar=grammar)


def text(token_ids: list[int]) -> str:
    return bytes(token_ids).decode()


FREE = [request("free1", [9, 10, 11], max_new_tokens=12), request("free2", [20, 21], max_new_tokens=12)]


def test_constrained_rows_match_their_grammar_and_free_neighbours_are_unchanged(
    model: LlamaForCausalLM, grammars: GrammarCompiler
) -> None:
    rows = [
        constrained("digits", "[0-9]{4}", grammars),
        constrained("word", "(cat|dog|bird)s?", grammars),
        constrained("sampled", "[a-e]{2}-[0-9]{2}", grammars, temperature=1.0, seed=5),
    ]
    outcomes = run_to_end(batched_engine(model), [rows[0], FREE[0], rows[1], FREE[1], rows[2]])
    assert re.fullmatch("[0-9]{4}", text(outcomes["digits"]))
    assert re.fullmatch("(cat|dog|bird)s?", text(outcomes["word"]).removesuffix("\x7f"))
    assert re.fullmatch("[a-e]{2}-[0-9]{2}", text(outcomes["sampled"]))
    alone = run_to_end(batched_engine(model), FREE)
    assert {r.request_id: outcomes[r.request_id] for r in FREE} == alone


def test_a_complete_grammar_stops_at_once_under_min_tokens_and_ignore_eos(
    model: LlamaForCausalLM, grammars: GrammarCompiler
) -> None:
    choice = grammars.compile(
        grammar_for(ChoiceConstraint(choices=["yes", "no"])), "structured_outputs.choice"
    )
    base = request("min", [5, 6, 7], max_new_tokens=20, eos=[EOS], min_new_tokens=10)
    engine = batched_engine(model)
    engine.add(dataclasses.replace(base, grammar=choice))  # ignore_eos: no EOS ids at all
    engine.add(dataclasses.replace(base, request_id="no-eos", eos_token_ids=frozenset(), grammar=choice))
    updates: list[SequenceUpdate] = []
    while engine.has_unfinished():
        updates += engine.step()
    finished = {update.request_id: update.finish_reason for update in updates if update.is_finished}
    assert finished == {"min": FinishReason.STOP, "no-eos": FinishReason.STOP}
    for request_id in finished:
        tokens = [t for u in updates if u.request_id == request_id for t in u.new_token_ids]
        assert text(tokens) in {"yes", "no"}


def test_a_broken_matcher_fails_its_row_alone(model: LlamaForCausalLM, grammars: GrammarCompiler) -> None:
    good = constrained("good", "[0-9]{4}", grammars)
    assert good.grammar is not None
    broken_matcher = good.grammar.matcher()
    assert not broken_matcher.consume_token(ord("x"))  # the matcher is now in its error state for good
    broken = dataclasses.replace(
        good, request_id="broken", grammar=CompiledGrammar("[0-9]{4}", broken_matcher)
    )
    produced, failed = run_with_failures(batched_engine(model), [good, *FREE, broken])
    assert failed == {"broken"} and produced["broken"] == []
    assert re.fullmatch("[0-9]{4}", text(produced["good"]))
    assert {r.request_id: produced[r.request_id] for r in FREE} == run_to_end(batched_engine(model), FREE)


def test_a_cut_by_max_tokens_stays_length(model: LlamaForCausalLM, grammars: GrammarCompiler) -> None:
    engine = batched_engine(model)
    engine.add(dataclasses.replace(constrained("cut", "[a-z]{10}", grammars), max_new_tokens=3))
    updates: list[SequenceUpdate] = []
    while engine.has_unfinished():
        updates += engine.step()
    assert [u.finish_reason for u in updates if u.is_finished] == [FinishReason.LENGTH]
    assert len([t for u in updates for t in u.new_token_ids]) == 3
