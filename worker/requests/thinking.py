"""Owns where a reasoning model's thinking stands when a job starts: open, closed by the prompt, or none.

A constrained job's grammar waits for the thinking to end (``worker/engine/reasoning_gate.py``)
only when there is thinking to wait for: a worker with a reasoning parser, and a prompt
that has not already closed it. Qwen3's ``enable_thinking: false`` renders an empty
``<think>\\n\\n</think>\\n\\n`` into the prompt: the output is the answer alone, so the
grammar holds from the first token and the output is not split (all of it is content).

"Closed" means the prompt *ends* with the end marker, trailing whitespace aside: a
``</think>`` further back belongs to an earlier assistant turn of the conversation.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.engine import ThinkingMarkers
from worker.requests.reasoning import THINK_END, THINK_START, ReasoningParserName
from worker.requests.tokenization import Tokenizer

# Whitespace tokens skipped at the prompt's end, looking for the closing marker.
TRAILING_WHITESPACE = 8


def thinking_markers(
    tokenizer: Tokenizer, parser: ReasoningParserName, prompt_ids: Sequence[int]
) -> ThinkingMarkers | None:
    """The markers a constrained output's grammar waits on; None when it holds from the first token."""
    if parser == "none":
        return None
    start = tuple(tokenizer.encode(THINK_START, add_special_tokens=False))
    end = tuple(tokenizer.encode(THINK_END, add_special_tokens=False))
    if not start or not end or prompt_closes_thinking(tokenizer, prompt_ids, end):
        return None
    return ThinkingMarkers(start, end, starts_thinking=parser == "deepseek_r1")


def prompt_closes_thinking(tokenizer: Tokenizer, prompt_ids: Sequence[int], end: Sequence[int]) -> bool:
    """Whether the prompt ends with the thinking's end marker (``end``), trailing whitespace aside."""
    tail = list(prompt_ids[-(len(end) + TRAILING_WHITESPACE) :])
    while tail:
        if tuple(tail[-len(end) :]) == tuple(end):
            return True
        # The marker is compared first: a tokenizer may decode an added token to nothing.
        if tokenizer.decode(tail[-1:]).strip():
            return False
        tail.pop()
    return False


def closes_thinking(tokenizer: Tokenizer, parser: ReasoningParserName, prompt_ids: Sequence[int]) -> bool:
    """Whether a reasoning parser is on and the prompt already closed the thinking (no split then)."""
    if parser == "none":
        return False
    end = tokenizer.encode(THINK_END, add_special_tokens=False)
    return bool(end) and prompt_closes_thinking(tokenizer, prompt_ids, end)
