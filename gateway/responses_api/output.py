"""Owns turning a response's token events into its output items and its stream events.

One ``OutputBuilder`` does both, so a streamed response and a whole one are the
same output by construction (``finished_response`` runs the builder and keeps
only the items). Items open in the order their text arrives and one is open at
a time, as OpenAI streams them: a delta's ``reasoning`` goes to a ``reasoning``
item, its ``text`` to a ``message`` item and each of its tool-call fragments to
the ``function_call`` item of that call; text of another kind than the open
item's closes it (``...done`` events) and opens the next (``...added``). A
response that produced nothing still answers one empty message, as before tools.
The item open when generation was cut (``length``) is ``incomplete``.

Ids derive from the request id, so a replayed stream has the same ones:
``msg_<rid>`` (then ``msg_<rid>_<k>`` for a later message), ``rs_<rid>``,
``fc_<rid>_<k>``; a call the worker gave no id gets ``call_<rid>_<k>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from gateway.responses_api.events import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    OutputItemEvent,
    ReasoningDeltaEvent,
    ReasoningDoneEvent,
    TextDeltaEvent,
    TextDoneEvent,
)
from gateway.responses_api.objects import (
    FunctionCallItem,
    ItemStatus,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
)
from gateway.responses_api.translate import (
    CALL_ID_PREFIX,
    CALL_ITEM_ID_PREFIX,
    REASONING_ID_PREFIX,
    message_id,
)
from shared.protocol import Delta, ToolCallDelta


@dataclass
class _Item:
    """One output item being built: its kind, id and text (or a call's name and arguments)."""

    kind: str  # "message" | "reasoning" | "function_call"
    id: str
    index: int  # its place in the output
    texts: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    call_index: int | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def shape(self, status: ItemStatus) -> OutputItem:
        # While it streams in, an item's part is announced by its own event; the item has none yet.
        is_open = status == "in_progress"
        if self.kind == "reasoning":
            thought = [] if is_open else [ReasoningText(text=self.text)]
            return ReasoningItem(id=self.id, content=thought, status=status)
        if self.kind == "function_call":
            return FunctionCallItem(
                id=self.id, call_id=self.call_id, name=self.name, arguments=self.text, status=status
            )
        return OutputMessage(
            id=self.id, status=status, content=[] if is_open else [OutputText(text=self.text)]
        )


class OutputBuilder:
    """Builds one response's output items from its deltas, with the stream events each step makes."""

    def __init__(self, request_id: str, next_number: Callable[[], int]) -> None:
        self._request_id = request_id
        self._next = next_number  # the stream's next sequence number
        self.items: list[_Item] = []
        self._open: _Item | None = None
        self._calls = 0
        self._messages = 0

    def add(self, delta: Delta) -> list[BaseModel]:
        """The stream events ``delta`` (of choice 0) makes."""
        made: list[BaseModel] = []
        if delta.reasoning:
            made += self._append("reasoning", delta.reasoning)
        if delta.text:
            made += self._append("message", delta.text)
        for fragment in delta.tool_calls or []:
            made += self._call_fragment(fragment)
        return made

    def finish(self, is_cut: bool) -> list[BaseModel]:
        """Close the open item (``incomplete`` when cut), opening an empty message if none was."""
        made = [] if self.items else self._open_item(_Item("message", self._message_id(), 0))
        return made + self._close(is_cut)

    def output(self, is_cut: bool) -> list[OutputItem]:
        """The items as they stand once finished."""
        last = self.items[-1] if self.items else None
        return [item.shape("incomplete" if is_cut and item is last else "completed") for item in self.items]

    def _append(self, kind: str, text: str) -> list[BaseModel]:
        made: list[BaseModel] = []
        if self._open is None or self._open.kind != kind:
            made += self._close(False)
            item_id = self._message_id() if kind == "message" else REASONING_ID_PREFIX + self._request_id
            made += self._open_item(_Item(kind, item_id, len(self.items)))
        assert self._open is not None
        self._open.texts.append(text)
        return made + [self._delta(self._open, text)]

    def _call_fragment(self, fragment: ToolCallDelta) -> list[BaseModel]:
        item = next((item for item in self.items if item.call_index == fragment.index), None)
        made: list[BaseModel] = []
        if item is None:
            made += self._close(False)
            item = self._new_call(fragment)
            made += self._open_item(item)
        if fragment.arguments:
            item.texts.append(fragment.arguments)
            made.append(self._delta(item, fragment.arguments))
        return made

    def _new_call(self, fragment: ToolCallDelta) -> _Item:
        number = self._calls
        self._calls += 1
        return _Item(
            "function_call",
            f"{CALL_ITEM_ID_PREFIX}{self._request_id}_{number}",
            len(self.items),
            call_id=fragment.id or f"{CALL_ID_PREFIX}{self._request_id}_{number}",
            name=fragment.name or "",
            call_index=fragment.index,
        )

    def _message_id(self) -> str:
        self._messages += 1
        first = message_id(self._request_id)
        return first if self._messages == 1 else f"{first}_{self._messages - 1}"

    def _open_item(self, item: _Item) -> list[BaseModel]:
        self.items.append(item)
        self._open = item
        added: list[BaseModel] = [
            OutputItemEvent(
                type="response.output_item.added",
                sequence_number=self._next(),
                output_index=item.index,
                item=item.shape("in_progress"),
            )
        ]
        if item.kind != "function_call":
            added.append(self._part_event(item, "response.content_part.added", ""))
        return added

    def _close(self, is_cut: bool) -> list[BaseModel]:
        item, self._open = self._open, None
        if item is None:
            return []
        done: list[BaseModel]
        if item.kind == "function_call":
            done = [
                ArgumentsDoneEvent(
                    sequence_number=self._next(),
                    item_id=item.id,
                    output_index=item.index,
                    name=item.name,
                    arguments=item.text,
                )
            ]
        else:
            done = [self._text_done(item), self._part_event(item, "response.content_part.done", item.text)]
        status: ItemStatus = "incomplete" if is_cut else "completed"
        return done + [
            OutputItemEvent(
                type="response.output_item.done",
                sequence_number=self._next(),
                output_index=item.index,
                item=item.shape(status),
            )
        ]

    def _delta(self, item: _Item, text: str) -> BaseModel:
        number, item_id, index = self._next(), item.id, item.index
        if item.kind == "reasoning":
            return ReasoningDeltaEvent(
                sequence_number=number, item_id=item_id, output_index=index, delta=text
            )
        if item.kind == "function_call":
            return ArgumentsDeltaEvent(
                sequence_number=number, item_id=item_id, output_index=index, delta=text
            )
        return TextDeltaEvent(sequence_number=number, item_id=item_id, output_index=index, delta=text)

    def _text_done(self, item: _Item) -> BaseModel:
        number = self._next()
        if item.kind == "reasoning":
            return ReasoningDoneEvent(
                sequence_number=number, item_id=item.id, output_index=item.index, text=item.text
            )
        return TextDoneEvent(sequence_number=number, item_id=item.id, output_index=item.index, text=item.text)

    def _part_event(self, item: _Item, kind: str, text: str) -> ContentPartEvent:
        part = ReasoningText(text=text) if item.kind == "reasoning" else OutputText(text=text)
        return ContentPartEvent(
            type=kind,
            sequence_number=self._next(),
            item_id=item.id,
            output_index=item.index,
            part=part,
        )


def output_items(request_id: str, deltas: Sequence[Delta], is_cut: bool) -> list[OutputItem]:
    """The output items of a finished response's deltas (choice 0's)."""
    builder = OutputBuilder(request_id, lambda: 0)
    for delta in deltas:
        builder.add(delta)
    builder.finish(is_cut)
    return builder.output(is_cut)
