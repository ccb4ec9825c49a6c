"""Owns turning Responses items into chat messages: a request's input, and a stored response's output.

Both are the same kinds of item: messages, ``function_call`` items and
``function_call_output`` items. Calls join the assistant message just before
them (a turn that said something and then called tools is one assistant message
with ``tool_calls``, the shape chat templates expect) or make an assistant
message of their own. A call's output becomes a ``tool`` message answering its
``call_id``, named after the function when the call is in the conversation
(some templates print the name). Reasoning items are left out: templates drop
earlier turns' thinking. ``developer`` messages are system messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.responses_api.objects import FunctionCallItem, OutputMessage, OutputText, ReasoningItem
from gateway.responses_api.schema import InputItem, InputText
from shared.protocol import ChatMessage, ToolCall

ConversationItem = InputItem | OutputMessage | FunctionCallItem | ReasoningItem
_ROLES = {"developer": "system"}


def chat_messages(
    items: Iterable[ConversationItem], earlier: Sequence[ChatMessage] = ()
) -> list[ChatMessage]:
    """``items`` as chat messages, following the ``earlier`` ones (which name the calls they made)."""
    messages: list[ChatMessage] = []
    names = {call.id: call.name for message in earlier for call in message.tool_calls or []}
    for item in items:
        if isinstance(item, InputItem):
            _add_input(messages, item, names)
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            _add_call(messages, ToolCall(id=item.call_id, name=item.name, arguments=item.arguments))
        elif isinstance(item, OutputMessage):
            messages.append(ChatMessage(role=item.role, content=_joined(item.content)))
    return messages


def _add_input(messages: list[ChatMessage], item: InputItem, names: dict[str, str]) -> None:
    # The item's own checks (schema.py) make sure each kind has the fields it needs.
    if item.type == "function_call":
        assert item.call_id is not None and item.name is not None and item.arguments is not None
        names[item.call_id] = item.name
        _add_call(messages, ToolCall(id=item.call_id, name=item.name, arguments=item.arguments))
    elif item.type == "function_call_output":
        assert item.call_id is not None
        messages.append(
            ChatMessage(
                role="tool",
                content=_joined(item.output or []),
                tool_call_id=item.call_id,
                name=names.get(item.call_id),
            )
        )
    elif item.type == "message":
        assert item.role is not None
        messages.append(
            ChatMessage(role=_ROLES.get(item.role, item.role), content=_joined(item.content or []))
        )


def _add_call(messages: list[ChatMessage], call: ToolCall) -> None:
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        messages[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or []), call]})
    else:
        messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _joined(parts: Sequence[InputText | OutputText]) -> str:
    return "\n".join(part.text for part in parts)
