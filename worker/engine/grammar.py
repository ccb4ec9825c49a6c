"""Owns constrained decoding's grammars: the model's llguidance tokenizer and grammars compiled against it.

A job's constraint becomes an llguidance grammar string in ``shared/structured``; here
that string is compiled against this model's vocabulary into a pristine
``LLMatcher``, and each sequence gets a ``deep_copy`` of it (a copy costs
microseconds, a compile up to milliseconds for a nested schema). Compiled grammars
are kept in an LRU keyed by the grammar text: agents send the same schema or tool
list with every turn. Compiling runs in the job's preparation, on a thread of its
own (``worker/driver/lifecycle.py``), never on the engine's step loop: a new schema
stalls no running row. Building the tokenizer (the trie behind every mask: ~0.4 s and
~40 MB for SmolLM2's 49k vocabulary) is paid once, by the first constrained job, as vLLM
does: a worker that never serves one never holds it. ``--grammar-tables-at-start`` pays it
at start-up instead, where ``warm_up`` then computes a first mask before the worker is ready.

Only the batched engine enforces grammars. A worker whose engine cannot (the
per-sequence engine, a tokenizer llguidance cannot read) has an ``unavailable``
compiler that refuses every constrained job with a 400 naming its parameter, rather
than generating unconstrained text the client would trust.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import llguidance

from shared.errors import InvalidRequest

logger = logging.getLogger(__name__)

DEFAULT_CACHE_SIZE = 256
# The warm-up's grammar: a small object, enough to build every lexer and parser structure once.
WARM_UP_SCHEMA = '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}'


@dataclass(frozen=True, slots=True, eq=False)
class CompiledGrammar:
    """A grammar compiled for this vocabulary; ``text`` is kept for backends that compile their own."""

    text: str
    pristine: llguidance.LLMatcher

    def matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start, for one sequence."""
        return self.pristine.deep_copy()


class GrammarCompiler:
    """Compiles grammar texts against one tokenizer, keeping the most recent ``cache_size`` by content.

    Thread-safe: several jobs are prepared at once. Two threads compiling the same new text
    may both compile it (llguidance drops the GIL while compiling; a lock would serialise
    unrelated schemas behind a slow one); the cache keeps one.
    """

    def __init__(
        self,
        tokenizer: llguidance.LLTokenizer | None,
        cache_size: int = DEFAULT_CACHE_SIZE,
        on_compile: Callable[[float], None] | None = None,
        unavailable: str | None = None,
        build_tokenizer: Callable[[], llguidance.LLTokenizer] | None = None,
    ) -> None:
        """``tokenizer``: built; else ``build_tokenizer`` builds it at the first compile."""
        self._tokenizer = tokenizer
        self._build_tokenizer = build_tokenizer
        self._building = threading.Lock()  # one build, which concurrent first compiles wait for
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._on_compile = on_compile
        self._unavailable = unavailable
        self.compiles = 0  # grammars compiled (cache misses), for tests and logs

    @classmethod
    def for_hf_tokenizer(
        cls,
        hf_tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Iterable[int],
        on_compile: Callable[[float], None] | None = None,
        at_start: bool = False,
    ) -> GrammarCompiler:
        """A compiler for a transformers tokenizer; masks are ``vocab_size`` wide (the model's logits).

        Its vocabulary tables are built by the first compile, or here where ``at_start``. A tokenizer
        llguidance cannot read (a slow, Python-only one) gives a compiler that refuses every grammar.
        """
        from transformers import PreTrainedTokenizerFast

        if not isinstance(hf_tokenizer, PreTrainedTokenizerFast):
            return cls.unavailable_because(
                "llguidance reads only fast (Rust) tokenizers, and this model's is a slow one"
            )
        eos = sorted(eos_token_ids)
        compiler = cls(
            None,
            on_compile=on_compile,
            build_tokenizer=partial(_llguidance_tokenizer, hf_tokenizer, vocab_size, eos),
        )
        if at_start:
            with contextlib.suppress(InvalidRequest):  # built, or why not kept for constrained jobs
                compiler._tokenizer_or_refusal("warm-up")
        return compiler

    @classmethod
    def unavailable_because(cls, reason: str) -> GrammarCompiler:
        """A compiler refusing every grammar with ``reason``: this worker cannot enforce any."""
        return cls(None, unavailable=reason)

    def _tokenizer_or_refusal(self, param: str) -> llguidance.LLTokenizer:
        """The vocabulary's tokenizer, built the first time; ``InvalidRequest`` naming ``param`` where
        this worker cannot enforce grammars."""
        if self._tokenizer is None and self._build_tokenizer is not None:
            with self._building:
                if self._tokenizer is None and self._build_tokenizer is not None:
                    self._tokenizer, self._unavailable = _built(self._build_tokenizer)
                    self._build_tokenizer = None
        if self._tokenizer is None:
            raise InvalidRequest(
                f"{param} cannot be enforced by this worker: {self._unavailable}.", param=param
            )
        return self._tokenizer

    def compile(self, text: str, param: str) -> CompiledGrammar:
        """``text`` compiled (or from the cache); ``InvalidRequest`` naming ``param`` if it cannot be."""
        tokenizer = self._tokenizer_or_refusal(param)
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                return cached
        compiled = self._compile(tokenizer, text, param)
        with self._lock:
            self._cache[text] = compiled
            self._cache.move_to_end(text)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, tokenizer: llguidance.LLTokenizer, text: str, param: str) -> CompiledGrammar:
        started = time.perf_counter()
        # The constructor never raises for a bad grammar: the matcher starts in its error state.
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
        # The first mask builds the grammar's first lexer states (about 1 ms): here rather than in a step.
        matcher.compute_bitmask()
        seconds = time.perf_counter() - started
        if matcher.is_error():
            problem = matcher.get_error().strip().splitlines()
            detail = problem[0][:300] if problem else "it does not compile"
            raise InvalidRequest(f"{param} cannot be enforced: {detail}", param=param)
        self.compiles += 1
        if self._on_compile is not None:
            self._on_compile(seconds)
        logger.debug("grammar compiled in %.2f ms", seconds * 1000)
        return CompiledGrammar(text, matcher)

    def warm_up(self) -> CompiledGrammar | None:
        """Compile a small JSON grammar (and its first mask: the first one builds lazy tables), where
        the vocabulary's tables are built already; None where they are not (built by the first job)."""
        if self._tokenizer is None:
            return None
        return self.compile(llguidance.LLMatcher.grammar_from_json_schema(WARM_UP_SCHEMA), "warm-up")


def _llguidance_tokenizer(hf_tokenizer: Any, vocab_size: int, eos: list[int]) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for a fast transformers one (its token trie; ~0.4 s for 49k tokens)."""
    import llguidance.hf

    started = time.perf_counter()
    tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos or None)
    logger.info("structured outputs: vocabulary tables built in %.2f s", time.perf_counter() - started)
    return tokenizer


def _built(
    build: Callable[[], llguidance.LLTokenizer],
) -> tuple[llguidance.LLTokenizer | None, str | None]:
    """What ``build`` returns, or None and why it cannot be built."""
    try:
        return build(), None
    except Exception:  # llguidance's own errors for a tokenizer it cannot parse
        # The worker still serves free text; constrained jobs get a 400 saying why.
        logger.exception("structured outputs are off: llguidance cannot read this tokenizer")
        return None, "llguidance cannot read the model's tokenizer (see the worker's log)"
