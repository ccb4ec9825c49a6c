"""Owns one request's output text: detokenizing its tokens, trimming stop sequences, counting usage.

The engine reports token ids; this turns each update into the protocol events a
client sees. Text that might be the start of a stop sequence is held back until
it is known not to be one, so a stop sequence never reaches a streaming client
even when it arrives split across tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from shared.protocol import Delta, Finished, FinishReason, TokenEvent, Usage
from worker.engine import SequenceUpdate
from worker.stopping import StopMatcher
from worker.tokenization import IncrementalDetokenizer, Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    prompt_tokens: int
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    completion_tokens: int = 0
    started_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None

    @classmethod
    def start(
        cls, tokenizer: Tokenizer, prompt_ids: tuple[int, ...], stop_sequences: tuple[str, ...]
    ) -> RequestOutput:
        return cls(
            len(prompt_ids), IncrementalDetokenizer(tokenizer, prompt_ids), StopMatcher(stop_sequences)
        )

    def consume(self, update: SequenceUpdate) -> list[TokenEvent]:
        """Events for one update; the list ends with ``Finished`` when the request is done."""
        self.completion_tokens += len(update.new_token_ids)
        if self.first_token_at is None and update.new_token_ids:
            self.first_token_at = time.monotonic()
        text = self.detokenizer.add(update.new_token_ids)
        if update.is_finished:
            text += self.detokenizer.flush()
        result = self.stops.feed(text)
        logger.debug("generated ids %s text %r", list(update.new_token_ids), text)
        if result.stop_sequence is not None:
            return self._with_text(result.text, update) + [
                self._finished(FinishReason.STOP, result.stop_sequence)
            ]
        if update.finish_reason is None:
            return self._with_text(result.text, update)
        return self._with_text(result.text + self.stops.flush(), update) + [
            self._finished(update.finish_reason)
        ]

    def _with_text(self, text: str, update: SequenceUpdate) -> list[TokenEvent]:
        return [Delta(text=text, token_ids=list(update.new_token_ids))] if text else []

    def _finished(self, reason: FinishReason, stop_sequence: str | None = None) -> Finished:
        self._log_finish(reason, stop_sequence)
        usage = Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)
        return Finished(finish_reason=reason, usage=usage, stop_sequence=stop_sequence)

    def _log_finish(self, reason: FinishReason, stop_sequence: str | None) -> None:
        elapsed = time.monotonic() - self.started_at
        first = (self.first_token_at or time.monotonic()) - self.started_at
        logger.info(
            "finished %s%s: %d prompt + %d completion tokens, %.1f tok/s, first token %.0f ms",
            reason.value,
            f" on stop sequence {stop_sequence!r}" if stop_sequence else "",
            self.prompt_tokens,
            self.completion_tokens,
            self.completion_tokens / elapsed if elapsed > 0 else 0.0,
            first * 1000,
        )
