"""Owns OpenAI's two logprobs shapes, built from the worker's per-token logprobs.

Chat answers one object per token, with its UTF-8 bytes and its top alternatives;
the legacy completions API answers parallel lists (tokens, logprobs, text offsets,
top alternatives as a map).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.openai.objects import ChoiceLogprobs, CompletionChoiceLogprobs, TokenLogprob, TopLogprob
from shared.protocol import PromptLogprob
from shared.protocol import TokenLogprob as WireLogprob
from shared.protocol import TopLogprob as WireTopLogprob


def chat_logprobs(entries: Sequence[WireLogprob]) -> ChoiceLogprobs:
    """Chat's shape: one object per token, its bytes and its top alternatives."""
    return ChoiceLogprobs(content=[_chat_entry(entry) for entry in entries])


def _chat_entry(entry: WireLogprob) -> TokenLogprob:
    return TokenLogprob(
        token=entry.token,
        logprob=entry.logprob,
        bytes=_bytes(entry.token),
        top_logprobs=[_top_entry(top) for top in entry.top],
    )


def _top_entry(top: WireTopLogprob) -> TopLogprob:
    return TopLogprob(token=top.token, logprob=top.logprob, bytes=_bytes(top.token))


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def completion_logprobs(
    entries: Sequence[WireLogprob | PromptLogprob], offset: int
) -> CompletionChoiceLogprobs:
    """The legacy shape: parallel lists; each token's text offset counts from ``offset`` (vLLM's way)."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return CompletionChoiceLogprobs(
        text_offset=offsets,
        token_logprobs=[entry.logprob for entry in entries],
        tokens=[entry.token for entry in entries],
        top_logprobs=[_top_map(entry) for entry in entries],
    )


def _top_map(entry: WireLogprob | PromptLogprob) -> dict[str, float] | None:
    if entry.logprob is None:
        return None  # the prompt's first token: nothing predicted it
    # The chosen token is listed too, as vLLM does, so logprobs=0 still names it.
    return {entry.token: entry.logprob} | {top.token: top.logprob for top in entry.top}
