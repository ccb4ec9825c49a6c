"""Owns tool calling for chat templates that know nothing of tools: the Hermes format, written into the chat.

Most small models' templates (the bundled SmolLM2's among them) render only ``role``
and ``content``: given ``tools`` they drop them silently, and an assistant message
holding only calls renders as nothing. For those templates the conversation is
rewritten into plain messages the template accepts, in the Hermes format that
Qwen2.5 and NousResearch's Hermes models were trained on (and that vLLM's ``hermes``
parser reads back), so the ``hermes`` tool-call parser finds the model's calls:

* the tools and the call format are described in the system message (appended to
  the first system message, or a new one in front);
* an assistant's calls become its text: one ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>`` block per call, after its content;
* tool results become a ``user`` message of ``<tool_response>`` blocks (consecutive
  results share one message, so templates that insist on alternating roles accept them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shared.protocol import ChatMessage, FunctionTool, ToolCall

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_CALL_INSTRUCTIONS = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tool_dict(tool: FunctionTool) -> dict[str, Any]:
    """A tool in OpenAI's shape, as transformers' ``apply_chat_template(tools=...)`` takes it."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.parameters if tool.parameters is not None else {"type": "object"}
    return {"type": "function", "function": function}


def arguments_value(arguments: str) -> Any:
    """A call's JSON arguments as a value (templates ``tojson`` them); text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def has_tool_parts(messages: Sequence[ChatMessage]) -> bool:
    """Whether the conversation holds calls or tool results (which a tool-less template cannot render)."""
    return any(message.tool_calls or message.role == "tool" for message in messages)


def tools_system_text(tools: Sequence[FunctionTool]) -> str:
    """The system prompt's part that offers the tools and says how to call them."""
    signatures = "\n".join(json.dumps(tool_dict(tool), ensure_ascii=False) for tool in tools)
    return _TOOLS_INTRO + signatures + _CALL_INSTRUCTIONS


def call_text(call: ToolCall) -> str:
    """One call as the model writes it in the Hermes format."""
    body = json.dumps({"name": call.name, "arguments": arguments_value(call.arguments)}, ensure_ascii=False)
    return f"{CALL_START}\n{body}\n{CALL_END}"


def fallback_messages(messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]) -> list[ChatMessage]:
    """The conversation as plain role/content messages carrying tools, calls and results as text."""
    plain: list[ChatMessage] = []
    results: list[str] = []  # consecutive tool results, waiting to become one user message
    for message in _with_tools_described(messages, tools):
        if message.role == "tool":
            results.append(f"<tool_response>\n{message.content or ''}\n</tool_response>")
            continue
        if results:
            plain.append(ChatMessage(role="user", content="\n".join(results)))
            results = []
        if message.tool_calls:
            plain.append(_assistant_with_calls(message, message.tool_calls))
        else:
            plain.append(ChatMessage(role=message.role, content=message.content or "", name=message.name))
    if results:
        plain.append(ChatMessage(role="user", content="\n".join(results)))
    return plain


def _with_tools_described(
    messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]
) -> list[ChatMessage]:
    if not tools:
        return list(messages)
    described = tools_system_text(tools)
    if messages and messages[0].role == "system":
        first = messages[0]
        content = f"{first.content}\n\n{described}" if first.content else described
        return [first.model_copy(update={"content": content}), *messages[1:]]
    return [ChatMessage(role="system", content=described), *messages]


def _assistant_with_calls(message: ChatMessage, calls: Sequence[ToolCall]) -> ChatMessage:
    parts = [message.content] if message.content else []
    parts += [call_text(call) for call in calls]
    return ChatMessage(role=message.role, content="\n".join(parts), name=message.name)
