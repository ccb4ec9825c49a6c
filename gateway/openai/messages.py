"""Owns turning OpenAI chat messages into the job protocol's: text parts, tool calls and tool results.

Assistant messages keep their calls (``tool_calls``) and ``tool`` messages the id of
the call they answer, so the worker's template can replay an agent's history.
The deprecated shapes are adapted here, once: an assistant's ``function_call``
becomes one tool call with an id made up from its message's position
(``call_legacy_<i>``), and a ``function`` message becomes a ``tool`` message
answering the latest such call of that name; templates then see one form only.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.openai.schema import ChatMessageParam, TextContentPart
from shared.protocol import ChatMessage, ToolCall

# Text parts of one message are joined like vLLM does, so parts stay separate words.
_PART_SEPARATOR = "\n"
# OpenAI's newer "developer" role is what older chat templates call "system";
# "function" is the deprecated name of "tool".
_ROLE_ALIASES = {"developer": "system", "function": "tool"}
_LEGACY_CALL_ID = "call_legacy_{position}"


def chat_messages(messages: Sequence[ChatMessageParam]) -> list[ChatMessage]:
    """The protocol's messages, legacy function calls and results turned into tool calls and results."""
    legacy_calls: dict[str, str] = {}  # function name -> id of its latest legacy call
    converted = []
    for position, message in enumerate(messages):
        if message.function_call is not None:
            legacy_calls[message.function_call.name] = _LEGACY_CALL_ID.format(position=position)
        answered = legacy_calls.get(message.name or "") if message.role == "function" else None
        converted.append(chat_message(message, position, answered))
    return converted


def chat_message(message: ChatMessageParam, position: int = 0, answered: str | None = None) -> ChatMessage:
    """One message; ``answered`` is the id of the call a legacy function message answers."""
    return ChatMessage(
        role=_ROLE_ALIASES.get(message.role, message.role),
        content=_content_text(message.content),
        name=message.name,
        tool_calls=_tool_calls(message, position),
        tool_call_id=message.tool_call_id or answered,
    )


def _tool_calls(message: ChatMessageParam, position: int) -> list[ToolCall] | None:
    calls = [
        ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
        for call in message.tool_calls or []
    ]
    if message.function_call is not None:
        legacy = message.function_call
        calls.append(
            ToolCall(
                id=_LEGACY_CALL_ID.format(position=position), name=legacy.name, arguments=legacy.arguments
            )
        )
    return calls or None


def _content_text(content: str | list[TextContentPart] | None) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return _PART_SEPARATOR.join(part.text for part in content)
