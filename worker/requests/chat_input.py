"""Owns what a chat template is given: messages as dicts, tools, and the template variables.

The shapes are transformers' (``apply_chat_template``), which the models' templates
are written against: tools in OpenAI's ``{"type": "function", "function": {...}}``
shape; an assistant's calls as ``{"id", "type": "function", "function": {"name",
"arguments"}}`` with the arguments as a *value*, since Qwen's, Llama's and Hermes'
templates write them with ``tojson`` (a JSON string would come out quoted twice);
a tool result as ``{"role": "tool", "tool_call_id", "content"}``.

Template variables (``chat_template_kwargs``) are the server's defaults with the
request's over them. Names ``apply_chat_template`` itself takes (``tokenize``,
``tools``, ...) would change how it runs rather than reach the template, so they
are refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shared.errors import InvalidRequest
from shared.protocol import ChatMessage, ChatPrompt, FunctionTool
from worker.requests.tool_fallback import arguments_value, fallback_messages, has_tool_parts, tool_dict

if TYPE_CHECKING:
    from worker.requests.tokenization import Tokenizer

# apply_chat_template's own parameters: not template variables.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens",
})  # fmt: skip


def supports_tools(template: str | None) -> bool:
    """Whether a template renders tools itself; None (no Jinja template at all) does not."""
    return template is not None and "tools" in template


def template_kwargs(defaults: Mapping[str, Any], requested: Mapping[str, Any] | None) -> dict[str, Any]:
    """The server's template variables with the request's over them; raises ``InvalidRequest``."""
    merged = {**defaults, **(requested or {})}
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(merged))
    if reserved:
        raise InvalidRequest(
            f"chat_template_kwargs may not set {', '.join(reserved)}: these are not template variables.",
            param="chat_template_kwargs",
        )
    return merged


def template_input(
    messages: Sequence[ChatMessage], tools: Sequence[FunctionTool] | None, *, template: str | None
) -> tuple[list[dict[str, Any]], list[dict[Any, Any]] | None]:
    """The conversation and tools for ``template``; written into plain messages when it has no tools."""
    if supports_tools(template):
        tool_dicts = [tool_dict(tool) for tool in tools or ()]
        return [message_dict(message) for message in messages], tool_dicts or None
    if tools or has_tool_parts(messages):
        messages = fallback_messages(messages, tools or ())
    return [message_dict(message) for message in messages], None


def message_dict(message: ChatMessage) -> dict[str, Any]:
    # Some templates test `'name' in message`; a None field must not look like a set one.
    fields: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name is not None:
        fields["name"] = message.name
    if message.tool_calls:
        fields["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments_value(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        fields["tool_call_id"] = message.tool_call_id
    return fields


def render_prompt(tokenizer: Tokenizer, prompt: ChatPrompt, default_kwargs: Mapping[str, Any]) -> str:
    """``prompt`` through ``tokenizer``'s template, with the merged template variables."""
    return tokenizer.render_chat(
        prompt.messages,
        add_generation_prompt=prompt.add_generation_prompt,
        tools=prompt.tools,
        template_kwargs=template_kwargs(default_kwargs, prompt.template_kwargs),
    )
