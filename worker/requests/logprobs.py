"""Owns turning the engine's token scores into wire logprobs: the token texts only the worker can decode.

A token's text is decoded alone, as vLLM does: a token holding part of a UTF-8
character decodes to U+FFFD, and the gateway derives ``bytes`` from that text, so
clients see the same thing from both servers.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.protocol import PromptLogprob, TokenLogprob, TopLogprob
from worker.engine import TokenScore
from worker.requests.tokenization import Tokenizer

# JSON has no -inf; a token the model rules out gets vLLM's floor instead.
LOGPROB_FLOOR = -9999.0


def to_token_logprob(score: TokenScore, tokenizer: Tokenizer) -> TokenLogprob:
    """The wire form of one scored token, with its alternatives."""
    return TokenLogprob(
        token_id=score.token_id,
        token=tokenizer.decode([score.token_id]),
        logprob=max(score.logprob, LOGPROB_FLOOR),
        top=[
            TopLogprob(
                token_id=token_id, token=tokenizer.decode([token_id]), logprob=max(logprob, LOGPROB_FLOOR)
            )
            for token_id, logprob in score.top
        ],
    )


def to_prompt_logprobs(
    scores: Sequence[TokenScore | None], prompt_ids: Sequence[int], tokenizer: Tokenizer
) -> list[PromptLogprob]:
    """The wire form of a prompt's scores; the first token has none."""
    return [
        PromptLogprob(token_id=token_id, token=tokenizer.decode([token_id]), logprob=None)
        if score is None
        else PromptLogprob.model_validate(to_token_logprob(score, tokenizer).model_dump())
        for token_id, score in zip(prompt_ids, scores, strict=True)
    ]
