"""Owns one choice's output: detokenizing its tokens, trimming stop sequences, parsing, counting usage.

The engine reports token ids; this turns each update into the protocol events a
client sees. Text that might be the start of a stop sequence is held back until
it is known not to be one, so a stop sequence never reaches a streaming client
even when it arrives split across tokens.

The text then goes through the choice's parser (``output_parsing.py``): reasoning
split off, tool calls found; a choice that made calls finishes with ``tool_calls``
instead of ``stop`` (``length`` stays ``length``).

Logprobs ride with the text their tokens produced: while a token's text is held
back (half a UTF-8 character, a possible stop sequence) its logprob waits too, and
whatever is still waiting goes out with the choice's last delta (the EOS token's
included, with its empty text).

A token counts as reasoning (``reasoning_tokens``) when the parser was inside the
thinking before its text or is after it: the markers count as thinking (an opening
marker of several tokens too, once the parser sees it whole), the whitespace after
``</think>`` does not. Text held back (a possible stop sequence) is
judged when it is released, so the count can be off by the few tokens at the border.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from shared.protocol import ChoiceFinished, Delta, FinishReason, PromptLogprob, TokenEvent, TokenLogprob
from worker.engine import SequenceUpdate
from worker.requests.logprobs import to_prompt_logprobs, to_token_logprob
from worker.requests.output_parsing import ChoiceParser, OutputParsing, Parsed
from worker.requests.stopping import StopMatcher
from worker.requests.tokenization import IncrementalDetokenizer, Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    prompt_tokens: int
    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    tokenizer: Tokenizer
    index: int = 0  # the choice this output is
    wants_logprobs: bool = False
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of the completion tokens, those of the thinking
    cached_prompt_tokens: int = 0  # of the prompt tokens, those the engine's prefix cache served
    held_tokens: int = 0  # tokens whose text the parser holds outside the thinking (a marker's start?)
    started_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    # Tokens whose text is not out yet (held back, or an incomplete UTF-8 character): they
    # ride on the next delta, so the stream's deltas always hold every published token.
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_token_ids: tuple[int, ...] = ()
    parser: ChoiceParser = field(default_factory=lambda: OutputParsing().parser(0))

    @classmethod
    def start(
        cls,
        tokenizer: Tokenizer,
        prompt_ids: tuple[int, ...],
        stop_sequences: tuple[str, ...],
        *,
        index: int = 0,
        wants_logprobs: bool = False,
        parsing: OutputParsing | None = None,
    ) -> RequestOutput:
        return cls(
            len(prompt_ids),
            IncrementalDetokenizer(tokenizer, prompt_ids),
            StopMatcher(stop_sequences),
            tokenizer,
            index=index,
            wants_logprobs=wants_logprobs,
            prompt_token_ids=prompt_ids,
            parser=(parsing or OutputParsing()).parser(index),
        )

    def replay(self, token_ids: list[int], published_text: str) -> None:
        """Catch up with tokens an earlier run of this request generated and published (a takeover).

        Afterwards the next event starts exactly where the client's text stops. The text
        is a pure function of the tokens, so the replay reproduces what was published,
        and leaves the parser holding what it held then (a call's ids come out the same).
        """
        self.completion_tokens += len(token_ids)
        text = ""
        for token in token_ids:  # one by one, as they were generated: the reasoning count depends on it
            was_thinking = self.parser.is_thinking
            text += self.parser.feed(self.stops.feed(self.detokenizer.add([token])).text).content
            self._count_reasoning(was_thinking, 1)
        if text != published_text:
            logger.error("resumed text differs from the published text: %r != %r", text, published_text)

    def consume(self, update: SequenceUpdate) -> list[TokenEvent]:
        """Events for one update; the list ends with ``ChoiceFinished`` when the choice is done."""
        self.completion_tokens += len(update.new_token_ids)
        if update.cached_prompt_tokens is not None:
            self.cached_prompt_tokens = update.cached_prompt_tokens
        was_thinking = self.parser.is_thinking
        events = self._events(update)
        self._count_reasoning(was_thinking, len(update.new_token_ids))
        if events and isinstance(events[-1], ChoiceFinished):
            events[-1] = events[-1].model_copy(update={"reasoning_tokens": self.reasoning_tokens})
        return events

    def _count_reasoning(self, was_thinking: bool, tokens: int) -> None:
        if was_thinking or self.parser.is_thinking:
            self.reasoning_tokens += tokens + self.held_tokens
            self.held_tokens = 0
        else:  # tokens of a marker the parser still holds count once it turns out to open the thinking
            self.held_tokens = self.held_tokens + tokens if self.parser.holds_text else 0

    def _events(self, update: SequenceUpdate) -> list[TokenEvent]:
        if self.first_token_at is None and update.new_token_ids:
            self.first_token_at = time.monotonic()
        self.pending_logprobs += [to_token_logprob(score, self.tokenizer) for score in update.logprobs or ()]
        prompt_logprobs = (
            None
            if update.prompt_logprobs is None
            else to_prompt_logprobs(update.prompt_logprobs, self.prompt_token_ids, self.tokenizer)
        )
        text = self.detokenizer.add(update.new_token_ids)
        if update.is_finished:
            text += self.detokenizer.flush()
        result = self.stops.feed(text)
        # Opt-in only (--log-level DEBUG): generated text is user data and never logged at INFO.
        logger.debug("generated ids %s text %r", list(update.new_token_ids), text)
        if result.stop_sequence is not None:
            return self._delta(self._last(result.text), update, prompt_logprobs, is_last=True) + [
                self._finished(FinishReason.STOP, result.stop_sequence)
            ]
        if update.finish_reason is None:
            return self._delta(self.parser.feed(result.text), update, prompt_logprobs, is_last=False)
        last = self._last(result.text + self.stops.flush())
        finished = self._finished(update.finish_reason)
        return self._delta(last, update, prompt_logprobs, is_last=True) + [finished]

    def _last(self, text: str) -> Parsed:
        """The parsed text of the choice's last delta: ``text`` and whatever the parser still held."""
        fed, held = self.parser.feed(text), self.parser.finish()
        return Parsed(
            fed.content + held.content, fed.reasoning + held.reasoning, fed.tool_calls + held.tool_calls
        )

    def _delta(
        self,
        parsed: Parsed,
        update: SequenceUpdate,
        prompt_logprobs: list[PromptLogprob] | None,
        *,
        is_last: bool,
    ) -> list[TokenEvent]:
        self.pending_ids.extend(update.new_token_ids)
        carries_logprobs = prompt_logprobs is not None or (is_last and bool(self.pending_logprobs))
        if not parsed and not carries_logprobs:
            return []
        logprobs: list[TokenLogprob] = []
        if parsed or is_last:  # a delta sent only for the prompt's logprobs leaves held tokens waiting
            logprobs, self.pending_logprobs = self.pending_logprobs, []
        token_ids, self.pending_ids = self.pending_ids, []
        return [
            Delta(
                text=parsed.content,
                token_ids=token_ids,
                index=self.index,
                logprobs=logprobs if self.wants_logprobs else None,
                prompt_logprobs=prompt_logprobs,
                reasoning=parsed.reasoning,
                tool_calls=parsed.tool_calls or None,
            )
        ]

    def _finished(self, reason: FinishReason, stop_sequence: str | None = None) -> ChoiceFinished:
        if reason is FinishReason.STOP and self.parser.has_calls:
            reason = FinishReason.TOOL_CALLS
        self._log_finish(reason, stop_sequence)
        return ChoiceFinished(
            index=self.index,
            finish_reason=reason,
            completion_tokens=self.completion_tokens,
            stop_sequence=stop_sequence,
        )

    def _log_finish(self, reason: FinishReason, stop_sequence: str | None) -> None:
        elapsed = time.monotonic() - self.started_at
        first = (self.first_token_at or time.monotonic()) - self.started_at
        logger.info(
            "finished %s%s%s: %d prompt + %d completion tokens, %.1f tok/s, first token %.0f ms",
            f"choice {self.index} " if self.index else "",
            reason.value,
            f" on stop sequence {stop_sequence!r}" if stop_sequence else "",
            self.prompt_tokens,
            self.completion_tokens,
            self.completion_tokens / elapsed if elapsed > 0 else 0.0,
            first * 1000,
        )
