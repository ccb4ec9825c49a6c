"""Owns text <-> tokens for the worker: the tokenizer interface, chat templates, incremental detokenization.

``transformers`` and ``jinja2`` are only imported for type checking or inside the
functions that need them, so importing this module stays cheap for the fake-engine
paths (tests, load tests) that never touch a real tokenizer.

Chat templates, in order of precedence: the operator's override (``--chat-template``),
the model's own template, then ``FALLBACK_CHAT_TEMPLATE``. A template that rejects
the messages (``raise_exception`` for a bad role or alternation, an undefined field)
is the client's fault and becomes ``InvalidRequest``; a template that is not valid
Jinja2 is the operator's fault and surfaces as a ``ValueError`` (a server error).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from shared.errors import InvalidRequest
from shared.protocol import ChatMessage, FunctionTool
from worker.requests.chat_input import template_input

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Tokenizer(Protocol):
    """What the driver needs from a tokenizer; the transformers one and the fake's both fit."""

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Decode without special tokens (what a client should see)."""
        ...

    @property
    def chat_template_source(self) -> str | None:
        """The Jinja2 chat template in use; None when chats are rendered without one (the fake's)."""
        ...

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool,
        tools: Sequence[FunctionTool] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Apply the chat template; raises ``shared.errors.InvalidRequest`` on bad template input.

        A template without tool support gets tools, calls and results written into its
        messages (``worker/requests/tool_fallback.py``).
        """
        ...


REPLACEMENT_CHAR = "\ufffd"

# How many prompt tokens the detokenizer decodes as context before the first generated
# one (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET, TGI's ``input_length - 5``).
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that are always whole, valid characters.

    TGI's ``decode_token`` algorithm. Two facts about tokenizers make the naive
    ``decode([new_token])`` wrong:

    * A token is not always a whole character. Byte-level BPE (GPT-2, SmolLM) and
      SentencePiece byte fallback (Llama's ``<0xF0>`` tokens) split a multi-byte UTF-8
      character such as an emoji over several tokens. Decoding only the first of
      them yields U+FFFD. So while the decoded text ends with U+FFFD we hold the
      tokens back and decode them again with the next ones, releasing the character
      only once its last byte has arrived.
    * A token's text depends on its neighbours. SentencePiece (Llama) marks a
      leading space with ``▁`` and its decoder strips the space at the start of the
      decoded string, so ``decode(["▁world"])`` is ``"world"`` while
      ``decode(["▁Hello", "▁world"])`` is ``"Hello world"``. Other decoders clean up
      spaces around punctuation. So we decode a window that begins with already
      emitted tokens (``prefix``) and emit only what the new tokens add to it:
      ``decode(prefix + new)[len(decode(prefix)):]``.

    The window starts on the last few prompt tokens, so the first generated token
    gets its leading space right too, and it slides forward on every emission, so
    each step decodes a handful of tokens, not the whole sequence.
    """

    __slots__ = ("_prefix_text", "_read_index", "_tokenizer", "_window")

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        # The window holds the prefix tokens (already emitted, decoded only as context)
        # followed by the tokens not emitted yet, which start at ``_read_index``.
        self._window: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._read_index = len(self._window)
        self._prefix_text: str | None = None  # decode of the prefix, cached until it changes

    def add(self, token_ids: Sequence[int]) -> str:
        """Append generated tokens; return the text they complete (possibly empty).

        All or nothing, as in TGI: if the pending tokens end inside a character, the
        text of every pending token is held, so released text always maps to whole tokens.
        """
        self._window.extend(token_ids)
        prefix_text, full_text = self._decode_window()
        # A shorter or equal text means the new tokens added nothing printable yet (a
        # special token, or bytes that the decoder merged into the replacement char).
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._advance()
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Release what is still held at the end; bytes that never formed a character come out as U+FFFD."""
        prefix_text, full_text = self._decode_window()
        self._advance()
        return full_text[len(prefix_text) :]

    def _decode_window(self) -> tuple[str, str]:
        if self._prefix_text is None:
            self._prefix_text = self._tokenizer.decode(self._window[: self._read_index])
        return self._prefix_text, self._tokenizer.decode(self._window)

    def _advance(self) -> None:
        """Make the tokens just emitted the new prefix, dropping the old one."""
        del self._window[: self._read_index]
        self._read_index = len(self._window)
        self._prefix_text = None


# Plain "role: content" lines for models that ship no template; mirrors the fake tokenizer's.
# transformers renders with trim_blocks and lstrip_blocks, so every newline is an explicit '\n'.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


def load_chat_template(path: str | Path) -> str:
    """Read a Jinja2 chat template file (the ``--chat-template`` override)."""
    template_path = Path(path)
    try:
        template = template_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read chat template {template_path}: {exc}") from exc
    if not template.strip():
        raise ValueError(f"chat template {template_path} is empty")
    return template


# Markers the output parsers read that some vocabularies make *special* tokens (Mistral's
# [TOOL_CALLS] and [ARGS], Llama 3's <|python_tag|>): decoding without special tokens would
# drop them and the calls after them would read as plain content. They stay in the text.
KEPT_SPECIAL_TOKENS = (
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
)


class HFTokenizer:
    """The ``Tokenizer`` protocol over a transformers tokenizer."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        extra_eos_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        eos_ids = set(extra_eos_ids)
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self._eos_token_ids = frozenset(eos_ids)
        self._chat_template = _choose_chat_template(tokenizer, chat_template)
        self._kept = _kept_special_tokens(tokenizer)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int]) -> str:
        ids = list(token_ids)
        if not self._kept or self._kept.keys().isdisjoint(ids):
            return str(self._tokenizer.decode(ids, skip_special_tokens=True))
        parts: list[str] = []
        start = 0
        for end, token_id in enumerate(ids):
            if token_id in self._kept:
                parts += [
                    str(self._tokenizer.decode(ids[start:end], skip_special_tokens=True)),
                    self._kept[token_id],
                ]
                start = end + 1
        parts.append(str(self._tokenizer.decode(ids[start:], skip_special_tokens=True)))
        return "".join(parts)

    @property
    def chat_template_source(self) -> str | None:
        template = self._chat_template or self._tokenizer.chat_template
        # A dict of named templates: transformers picks "tool_use" when given tools, if there is one.
        if isinstance(template, dict):
            return str(template.get("tool_use") or template.get("default") or "\n".join(template.values()))
        return str(template) if template else None

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool,
        tools: Sequence[FunctionTool] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        from jinja2 import TemplateError, TemplateSyntaxError

        conversation, tool_dicts = template_input(messages, tools, template=self.chat_template_source)
        try:
            rendered = self._tokenizer.apply_chat_template(
                conversation,
                tools=[*tool_dicts] if tool_dicts else None,  # a list of the wider type it takes
                chat_template=self._chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **(template_kwargs or {}),
            )
        except TemplateSyntaxError as exc:
            raise ValueError(f"the chat template is not valid Jinja2: {exc}") from exc
        except TemplateError as exc:
            raise InvalidRequest(f"the chat template rejected the messages: {exc}", param="messages") from exc
        return str(rendered)


def _kept_special_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """The ids of ``KEPT_SPECIAL_TOKENS`` that are special in this vocabulary (skipped by decode)."""
    vocabulary = tokenizer.get_vocab()
    kept: dict[int, str] = {}
    for marker in KEPT_SPECIAL_TOKENS:
        token_id = vocabulary.get(marker)
        if token_id is not None and not tokenizer.decode([token_id], skip_special_tokens=True):
            kept[token_id] = marker
    return kept


def _choose_chat_template(tokenizer: PreTrainedTokenizerBase, override: str | None) -> str | None:
    """The template to pass to ``apply_chat_template``; None lets transformers pick the model's own."""
    if override is not None:
        return override
    # The model's template may be a dict of named templates; transformers resolves that itself.
    if tokenizer.chat_template:
        return None
    return FALLBACK_CHAT_TEMPLATE
