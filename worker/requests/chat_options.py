"""Owns the worker's chat options: template variables and output parsers, resolved once at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.settings import WorkerSettings
from worker.requests.reasoning import ReasoningParserName
from worker.requests.tool_calls import ToolParserName, resolve_parser_name


@dataclass(frozen=True, slots=True)
class ChatOptions:
    # The server's chat_template_kwargs, under each request's own.
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    # The tool-call format (``auto`` already resolved from the template); None: no parsing.
    call_format: ToolParserName | None = "hermes"
    reasoning: ReasoningParserName = "none"

    @classmethod
    def of(cls, settings: WorkerSettings, template: str | None) -> ChatOptions:
        """The options ``settings`` give a model whose chat template is ``template``."""
        return cls(
            dict(settings.default_chat_template_kwargs.model_extra or {}),
            resolve_parser_name(settings.tool_call_parser, template),
            settings.reasoning_parser,
        )
