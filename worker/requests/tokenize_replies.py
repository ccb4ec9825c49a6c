"""Owns answering tokenize and detokenize jobs: the worker's tokenizer, offered to the gateway.

vLLM's ``/tokenize`` and ``/detokenize`` semantics: a text prompt is encoded with
special tokens unless the client says otherwise; chat messages are rendered with
the model's template first (which writes its own special tokens), with its tools and
template variables as for generation; token ids are
decoded without special tokens, as generated text is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import InvalidRequest
from shared.protocol import ChatPrompt, TextPrompt, Tokenized, TokenizeJob, TokenPrompt
from worker.requests.chat_input import render_prompt
from worker.requests.tokenization import Tokenizer


@dataclass(frozen=True, slots=True)
class TokenizeService:
    tokenizer: Tokenizer
    max_model_len: int
    vocab_size: int
    # The server's chat template variables (``--default-chat-template-kwargs``).
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def answer(self, job: TokenizeJob) -> Tokenized:
        """Tokenize or detokenize ``job``'s prompt; raises ``InvalidRequest`` for bad token ids."""
        prompt = job.prompt
        if isinstance(prompt, TokenPrompt):
            return self._detokenize(prompt.token_ids)
        if isinstance(prompt, TextPrompt):
            text = prompt.text
            tokens = self.tokenizer.encode(text, add_special_tokens=job.add_special_tokens)
        else:
            text = self._render(prompt)
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
        return Tokenized(tokens=tokens, text=text, max_model_len=self.max_model_len)

    def _detokenize(self, token_ids: list[int]) -> Tokenized:
        bad = [token for token in token_ids if not 0 <= token < self.vocab_size]
        if bad:
            raise InvalidRequest(
                f"Token ids must be in [0, {self.vocab_size}); got {bad[:5]}.", param="tokens"
            )
        text = self.tokenizer.decode(token_ids)
        return Tokenized(tokens=token_ids, text=text, max_model_len=self.max_model_len)

    def _render(self, prompt: ChatPrompt) -> str:
        return render_prompt(self.tokenizer, prompt, self.template_kwargs)
