"""A constrained reasoning model in the batched engine: the grammar waits while the model thinks.

The tiny Llama's ids are bytes (``tests.engines.byte_grammars``), so ``<think>`` and
``</think>`` are markers of several tokens here; ``SINGLE`` stands for Qwen3's and
DeepSeek-R1's one-token markers. ``scripted_llama`` forces the thinking text where no
mask stops it; the grammar then decides what follows.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from shared.protocol import FinishReason, JsonConstraint, RegexConstraint
from shared.structured.grammars import grammar_for
from tests.engines import batched_engine, byte_grammars, request, scripted_llama
from worker.engine import EngineRequest, SequenceUpdate, ThinkingMarkers
from worker.engine.fake import ByteTokenizer
from worker.engine.grammar import CompiledGrammar, GrammarCompiler
from worker.engine.reasoning_gate import ReasoningGate
from worker.requests.thinking import thinking_markers

PROMPT = [5, 6, 7]
R1 = ThinkingMarkers(tuple(b"<think>"), tuple(b"</think>"), starts_thinking=True)
QWEN3 = dataclasses.replace(R1, starts_thinking=False)
SINGLE = ThinkingMarkers((1,), (2,), starts_thinking=False)  # one id each, as Qwen3's
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def grammars() -> GrammarCompiler:
    return byte_grammars()


def digits(grammars: GrammarCompiler) -> CompiledGrammar:
    return grammars.compile(grammar_for(RegexConstraint(pattern="[0-9]{4}")), "structured_outputs.regex")


def gated(
    grammar: CompiledGrammar, thinking: ThinkingMarkers | None, max_new_tokens: int = 40
) -> EngineRequest:
    base = request("r", PROMPT, max_new_tokens=max_new_tokens, eos=[127])
    return dataclasses.replace(base, grammar=grammar, thinking=thinking)


def generate(script: bytes | list[int], engine_request: EngineRequest) -> tuple[bytes, FinishReason | None]:
    """The request's output and finish reason, the model following ``script`` where the grammar lets it."""
    engine = batched_engine(scripted_llama(len(PROMPT), list(script)))
    engine.add(engine_request)
    updates: list[SequenceUpdate] = []
    while engine.has_unfinished():
        updates += engine.step()
    assert not any(update.failed for update in updates)
    output = bytes(token for update in updates for token in update.new_token_ids if token != 127)
    return output, updates[-1].finish_reason


def test_deepseek_r1_thinks_freely_then_answers_in_json(grammars: GrammarCompiler) -> None:
    schema = grammars.compile(grammar_for(JsonConstraint(json_schema=SCHEMA)), "response_format")

    output, reason = generate(b"Hmm, x < y.</think>", gated(schema, R1, max_new_tokens=80))

    thinking, _, answer = output.partition(b"</think>")
    assert thinking == b"Hmm, x < y." and reason is FinishReason.STOP
    assert isinstance(json.loads(answer)["ok"], bool)


def test_qwen3_thinks_only_when_the_output_opens_the_marker(grammars: GrammarCompiler) -> None:
    output, _ = generate(b"<think>no digits</think>", gated(digits(grammars), QWEN3))

    assert re.fullmatch(rb"<think>no digits</think>[0-9]{4}", output)


def test_qwen3_answering_straight_away_is_held_to_the_grammar_from_the_first_token(
    grammars: GrammarCompiler,
) -> None:
    # The script asks for "7" then text the grammar refuses: without thinking, nothing is free.
    output, reason = generate(b"7abc</think>", gated(digits(grammars), QWEN3))

    assert re.fullmatch(rb"7[0-9]{3}", output) and reason is FinishReason.STOP


def test_one_token_markers_open_and_close_the_thinking(grammars: GrammarCompiler) -> None:
    output, _ = generate([1, *b"free text", 2], gated(digits(grammars), SINGLE))

    assert re.fullmatch(rb"\x01free text\x02[0-9]{4}", output)


def test_without_markers_the_grammar_holds_from_the_first_token(grammars: GrammarCompiler) -> None:
    output, _ = generate(b"Hmm</think>", gated(digits(grammars), None))

    assert re.fullmatch(rb"[0-9]{4}", output)


def test_a_cut_by_max_tokens_while_thinking_is_length(grammars: GrammarCompiler) -> None:
    output, reason = generate(b"a long thought", gated(digits(grammars), R1, max_new_tokens=5))

    assert (output, reason) == (b"a lon", FinishReason.LENGTH)


def resumed(engine_request: EngineRequest, generated: bytes) -> EngineRequest:
    """The request as a takeover runs it: what the dead run generated appended to its prompt."""
    return dataclasses.replace(
        engine_request,
        prompt_token_ids=engine_request.prompt_token_ids + tuple(generated),
        resumed_tokens=len(generated),
    )


def test_a_takeover_mid_thinking_resumes_dormant_then_the_grammar_holds(grammars: GrammarCompiler) -> None:
    script = b"Hmm, ab.</think>"
    engine_request = resumed(gated(digits(grammars), R1), script[:10])  # cut inside "</think>"

    output, _ = generate(script, engine_request)

    assert re.fullmatch(rb"think>[0-9]{4}", output)


def test_a_takeover_mid_answer_resumes_with_the_answer_consumed(grammars: GrammarCompiler) -> None:
    engine_request = resumed(gated(digits(grammars), R1), b"Hmm.</think>12")

    output, reason = generate(b"Hmm.</think>12", engine_request)

    assert re.fullmatch(rb"[0-9]{2}", output) and reason is FinishReason.STOP


def test_tokens_the_grammar_refuses_after_the_thinking_are_refused(grammars: GrammarCompiler) -> None:
    assert ReasoningGate(digits(grammars).matcher(), R1).consume_all(list(b"x < y.</think>12"))
    assert not ReasoningGate(digits(grammars).matcher(), R1).consume_all(list(b"Hmm.</think>x"))
    assert not ReasoningGate(digits(grammars).matcher(), QWEN3).consume_all(list(b"x"))


def test_choosing_allows_the_grammar_and_the_opening_marker_only(grammars: GrammarCompiler) -> None:
    for marker in (QWEN3, dataclasses.replace(SINGLE, start=(127,))):  # 127: bit 31 of its int32 word
        gate = ReasoningGate(digits(grammars).matcher(), marker)
        row = torch.zeros(4, dtype=torch.int32)
        gate.fill_mask(row)
        allowed = {t for t in range(128) if (int(row[t // 32]) >> (t % 32)) & 1}
        assert allowed == {*b"0123456789", marker.start[0]}
    dormant = ReasoningGate(digits(grammars).matcher(), R1)
    assert not dormant.needs_mask and dormant.consume(ord("x")) and not dormant.is_stopped()


def test_markers_are_none_when_the_prompt_already_closed_the_thinking() -> None:
    tokenizer = ByteTokenizer()
    closed = list(b"user: Hi\nassistant:<think>\n\n</think>\n\n")
    open_ = list(b"user: Hi\nassistant:<think>\n")
    earlier_turn = list(b"assistant:<think>a</think>b\nuser: Hi\nassistant:")
    assert thinking_markers(tokenizer, "qwen3", closed) is None
    assert thinking_markers(tokenizer, "deepseek_r1", closed) is None
    assert thinking_markers(tokenizer, "none", open_) is None
    assert thinking_markers(tokenizer, "deepseek_r1", open_) == R1
    assert thinking_markers(tokenizer, "qwen3", earlier_turn) == QWEN3
