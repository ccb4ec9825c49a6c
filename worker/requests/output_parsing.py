"""Owns turning a choice's released text into what a client sees: content, reasoning and tool calls.

The order is fixed: the text (already detokenized and trimmed of stop sequences)
goes through the reasoning splitter, then the content it leaves through the
tool-call parser. ``OutputParsing`` is what a prepared request carries to say which
of the two a choice gets; ``ChoiceParser`` is one choice's running pair.

Constrained output (a structured-output constraint, or a required or named tool
choice) keeps the reasoning split: its grammar is dormant while the model thinks
(``worker/engine/reasoning_gate.py``), so the thinking is reasoning and the answer that
matches the grammar is content (or tool calls). A prompt that already closed the
thinking (Qwen3's ``enable_thinking: false``) skips the split: the output is all
answer, and deepseek_r1's "the output starts inside the thinking" would otherwise take
it for reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.protocol import GenerationJob, ToolCallDelta, ToolChoice
from worker.requests.reasoning import ReasoningParserName, ReasoningSplitter, Split
from worker.requests.tool_calls import CallIds, CallsParsed, ToolCallParser, ToolParserName, call_parser


@dataclass(frozen=True, slots=True)
class Parsed:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass(frozen=True, slots=True)
class OutputParsing:
    """Which parsers a request's choices get; the default parses nothing."""

    request_id: str = ""
    tool_choice: ToolChoice | None = None
    call_format: ToolParserName | None = None
    reasoning: ReasoningParserName = "none"

    @classmethod
    def of(
        cls,
        job: GenerationJob,
        call_format: ToolParserName | None,
        reasoning: ReasoningParserName,
        *,
        thought: bool = False,
    ) -> OutputParsing:
        """The parsing of ``job``'s choices; ``thought``: the prompt already closed the thinking."""
        return cls(job.request_id, job.tool_choice, call_format, "none" if thought else reasoning)

    def parser(self, choice: int) -> ChoiceParser:
        """A fresh parser for choice ``choice``."""
        splitter = None if self.reasoning == "none" else ReasoningSplitter(self.reasoning)
        calls = call_parser(self.tool_choice, self.call_format, CallIds(self.request_id, choice))
        return ChoiceParser(splitter, calls)


class ChoiceParser:
    """Stateful, per choice: feed it each piece of released text in order."""

    __slots__ = ("_calls", "_splitter")

    def __init__(self, splitter: ReasoningSplitter | None, calls: ToolCallParser | None) -> None:
        self._splitter = splitter
        self._calls = calls

    @property
    def is_thinking(self) -> bool:
        return self._splitter is not None and self._splitter.is_thinking

    @property
    def holds_text(self) -> bool:
        return self._splitter is not None and self._splitter.holds_text

    @property
    def has_calls(self) -> bool:
        return self._calls is not None and self._calls.has_calls

    def feed(self, text: str) -> Parsed:
        split = self._splitter.feed(text) if self._splitter is not None else Split(content=text)
        return self._with_calls(split, self._calls.feed(split.content) if self._calls else None)

    def finish(self) -> Parsed:
        """What the parsers still hold once the text has ended."""
        split = self._splitter.finish() if self._splitter is not None else Split()
        if self._calls is None:
            return self._with_calls(split, None)
        fed, finished = self._calls.feed(split.content), self._calls.finish()
        calls = CallsParsed(fed.content + finished.content, fed.calls + finished.calls)
        return self._with_calls(split, calls)

    @staticmethod
    def _with_calls(split: Split, calls: CallsParsed | None) -> Parsed:
        if calls is None:
            return Parsed(split.content, split.reasoning)
        return Parsed(calls.content, split.reasoning, calls.calls)
