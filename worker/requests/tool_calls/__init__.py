"""Owns finding a choice's tool calls in its text: formats, the streaming scanner, forced calls, ids.

Which parser a choice gets follows the job's tool choice: ``auto`` scans the text for
calls in the worker's format (``--tool-call-parser``), ``required`` and ``named`` read
the constrained output as calls, ``none`` and no tools parse nothing.
"""

from __future__ import annotations

from typing import Literal, Protocol

from shared.protocol import ToolChoice
from worker.requests.tool_calls.forced import NamedCall, RequiredCalls
from worker.requests.tool_calls.formats import FORMATS, ToolParserName
from worker.requests.tool_calls.ids import CallIds
from worker.requests.tool_calls.scanner import CallScanner, CallsParsed

ToolParserSetting = Literal["auto", "hermes", "llama3_json", "mistral", "none"]

# How a chat template shows which format its model writes calls in, most specific first.
_TEMPLATE_SIGNS: tuple[tuple[str, ToolParserName], ...] = (
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3_json"),
    ("<|eom_id|>", "llama3_json"),
)


class ToolCallParser(Protocol):
    """Stateful, per choice: content in, content and call fragments out."""

    @property
    def has_calls(self) -> bool: ...

    def feed(self, text: str) -> CallsParsed: ...

    def finish(self) -> CallsParsed: ...


def resolve_parser_name(setting: ToolParserSetting, template: str | None) -> ToolParserName | None:
    """The format ``auto`` means for ``template`` (hermes, the fallback's, when unknown); None: off."""
    if setting == "none":
        return None
    if setting != "auto":
        return setting
    return next((name for sign, name in _TEMPLATE_SIGNS if template and sign in template), "hermes")


def call_parser(
    choice: ToolChoice | None, name: ToolParserName | None, ids: CallIds
) -> ToolCallParser | None:
    """The parser for one choice under ``choice``; None when its text holds no calls to find."""
    if choice is None or choice.mode == "none":
        return None
    if choice.mode == "named" and choice.name is not None:
        return NamedCall(choice.name, ids)
    if choice.mode == "required":
        return RequiredCalls(ids)
    if name is None:
        return None
    return CallScanner(FORMATS[name], ids, max_calls=None if choice.parallel else 1)


__all__ = ["CallIds", "CallsParsed", "ToolCallParser", "ToolParserName", "ToolParserSetting", "call_parser"]
