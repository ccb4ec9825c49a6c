"""Structured outputs' vocabulary tables are built once, by the first grammar a worker compiles:
concurrent first compiles share one build, and a tokenizer that cannot be built refuses every
grammar with a 400 naming its parameter, without building again."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import llguidance
import pytest

from shared.errors import InvalidRequest
from tests.engines import VOCAB, ByteVocabulary
from worker.engine.grammar import GrammarCompiler

WAIT_S = 10.0


def test_concurrent_first_compiles_share_one_build_of_the_tables() -> None:
    builds: list[str] = []
    release = threading.Event()

    def build() -> llguidance.LLTokenizer:
        builds.append(threading.current_thread().name)
        release.wait(WAIT_S)  # the other compiles arrive while this build runs
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocabulary()), n_vocab=VOCAB)

    compiler = GrammarCompiler(None, build_tokenizer=build)
    texts = [llguidance.LLMatcher.grammar_from_regex(f"[a-z]{{{n}}}") for n in range(1, 5)]
    with ThreadPoolExecutor(len(texts)) as pool:
        compiling = [pool.submit(compiler.compile, text, "structured_outputs.regex") for text in texts]
        time.sleep(0.2)
        release.set()
        compiled = [future.result(WAIT_S) for future in compiling]

    assert len(builds) == 1
    assert compiler.compiles == len(texts)
    assert all(grammar.matcher().consume_tokens(list(b"a")) for grammar in compiled)


def test_tables_that_cannot_be_built_refuse_every_grammar_naming_its_parameter_and_are_not_retried() -> None:
    builds: list[int] = []

    def build() -> llguidance.LLTokenizer:
        builds.append(1)
        raise ValueError("a tokenizer llguidance cannot parse")

    compiler = GrammarCompiler(None, build_tokenizer=build)
    regex = llguidance.LLMatcher.grammar_from_regex("[a-z]{3}")
    for param in ("response_format", "structured_outputs.regex"):
        with pytest.raises(InvalidRequest, match="cannot read the model's tokenizer") as refused:
            compiler.compile(regex, param)
        assert refused.value.param == param
    assert builds == [1]
    assert compiler.warm_up() is None  # nothing to warm up: the worker serves free text
