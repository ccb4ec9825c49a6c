"""Owns the running batch's KV cache: preallocated slots written in place, one row per running sequence.

Per layer, keys and values live in one tensor each, ``[slots, kv_heads, capacity,
head_dim]``. Running row ``i`` is slot ``i`` (rows stay packed at the front) and holds
its ``lengths[i]`` tokens at columns ``0..lengths[i]``: a decode step writes each
row's new key and value at its own length, in place, and attends over the first
``max(lengths) + 1`` columns of the first ``rows`` slots, a view, with a mask of each
row's length (``decode_attention.py`` reads it). Nothing is concatenated or copied per
step: the old cache (``kv_cache.PaddedKVCache``) rebuilt every layer's tensors with
``torch.cat`` each step, 14 % of a 32-row bf16 step here (12 of 85 ms, torch.profiler).

Why slots and not paged blocks: on CPU, attention over a block table needs a gather
(or a kernel we do not have) every step, while a slot is a plain strided view that
``matmul`` reads as it is. What slots cost is capacity: every slot is as long as the
longest row may need. Storage therefore grows by doubling, in rows and in columns,
only when a row needs it (a copy of what is held, rare: log2 of the longest length),
and the engine admits by the tokens the slots hold (``held_tokens``), not by a
padded reservation of each request's maximum.

The rows change only between forwards: prefilled rows join (``join``: their real
columns gathered out of the padded prefill cache in one copy per layer), finished ones
leave (``keep``: the kept rows move down to stay packed). A failed forward needs no
undo: it can only have written at columns past every row's length, which nothing
reads; ``advance`` counts the new token only after a forward succeeded.

Half-precision steps on CPU that attend with matmuls (the fused kernel off or not built:
``decode_attention.py``) read whole slots instead (``whole_slots``): oneDNN's bf16
matmul copies an operand that is not contiguous (torch's ``mkldnn_matmul``), and the
first columns of every slot are not, so each layer copied its keys and values every
step: 29.6 of a 116 ms 16-row bf16 step at ~1,450 columns (torch.profiler), and per
layer 1,069 us against 611 for the same product on contiguous operands. Such a cache
keeps its columns tight instead of doubling them (multiples of
``WHOLE_SLOT_QUANTUM``, grown as the longest row needs and shrunk when it leaves,
each a copy of what is held, once per 64 steps at most) and a step reads all of
them, masked past each row's length: a contiguous view. fp32 steps keep the narrow
view: BLAS reads its strides as they are.

Resident memory follows the tokens held, not the capacity. The storage must read as zeros past
every row's length (a masked column still enters the attention's product with the values, and
uninitialised memory may hold NaNs, which a zero weight does not cancel), yet zeroing it with
``torch.zeros`` writes every page: 32 rows of 256 columns took 377 MB resident in fp32 for the
~150 MB of ~104-token rows a c=32 chat run holds. On CPU each layer's storage is therefore
memory mapped for it (``zeroed``): the system hands out zero-filled pages as they are first
written, reading an untouched one costs no memory, and the map goes back whole when the storage
is replaced or dropped, whatever the C allocator would have kept.

Plugged into transformers as a ``Cache`` (``update`` is all a decoder layer calls) so
any model whose layers are plain full attention keeps its own forward.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import torch
from transformers.cache_utils import Cache

from worker.engine.kv_cache import PaddedKVCache
from worker.model.freed_memory import advise_dontneed

# Columns are allocated in multiples of this, so a growing row reallocates rarely.
COLUMN_QUANTUM = 256
# A whole-slot cache's columns grow and shrink in steps of this (see the module docstring).
WHOLE_SLOT_QUANTUM = 64


class SlotKVCache(Cache):
    """The running rows' KV in preallocated per-layer slots (see the module docstring)."""

    def __init__(self, num_layers: int, max_rows: int, whole_slots: bool = False) -> None:
        super().__init__(layers=[])
        self._num_layers = num_layers
        self._max_rows = max_rows
        self._whole_slots = whole_slots  # a step reads every column of its rows' slots
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []  # tokens held by each running row, row i first
        # The step in flight's write positions (the lengths), rows and mask.
        self._positions: torch.Tensor | None = None
        self._rows_index: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        # Bumped whenever the storage is reallocated: CUDA graphs captured on the old one are stale.
        self.generation = 0

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def slot_count(self) -> int:
        return int(self.keys[0].shape[0]) if self.keys else 0

    def held_tokens(self) -> int:
        """Cache positions the storage holds now (slots x columns): the memory in use."""
        return self.slot_count * self.capacity

    def storage(self) -> list[tuple[int, int]]:
        """Each layer's key and value storage addresses: unchanged from step to step unless it grew."""
        pairs = zip(self.keys, self.values, strict=True)
        return [(keys.data_ptr(), values.data_ptr()) for keys, values in pairs]

    def begin_decode(
        self, batch: int | None = None, columns: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids ``[batch, 1]`` and the boolean attention mask ``[batch, 1, 1, columns]`` of a
        forward appending one token to every row; makes room for it first.

        ``batch`` (at least ``rows``) pads the forward with idle rows, for a compiled step of a
        fixed batch size (``compiled_decode.py``): they write into free slots at column 0 and
        attend to that column alone, and nothing reads what they compute. ``columns`` (at least
        the longest row's length + 1) widens the columns read, masked, to a fixed count: a CUDA
        graph's shapes (``graphed_decode.py``).
        """
        batch = self.rows if batch is None else batch
        width = max(self.lengths) + 1
        if columns is None and self._whole_slots:
            self._reserve(batch, width)
            width = self.capacity
        elif columns is None:
            # One spare column at least: the columns read are then never the whole slot, so their
            # view is never contiguous, and a compiled step never meets a layout it did not compile for.
            self._reserve(batch, width + 1)
        else:
            self._reserve(batch, columns)
            width = columns
        device = self.keys[0].device
        positions = torch.zeros(batch, dtype=torch.long, device=device)
        positions[: self.rows] = torch.tensor(self.lengths, dtype=torch.long, device=device)
        column_ids = torch.arange(width, device=device)
        mask = (column_ids.unsqueeze(0) <= positions.unsqueeze(1))[:, None, None, :]
        self._positions, self._mask = positions, mask
        self._rows_index = torch.arange(batch, device=device)
        return positions.unsqueeze(1), mask

    def step_tensors(self) -> tuple[torch.Tensor, ...]:
        """The step in flight's own tensors, each ``[batch, ...]``: write positions, rows and mask.

        A compiled step reads them through this cache, so they are graph inputs whose batch
        dimension must be marked dynamic with the forward's (``compiled_decode.py``).
        """
        if self._positions is None or self._rows_index is None or self._mask is None:
            raise RuntimeError("step_tensors is for the step begin_decode started")
        return self._positions, self._rows_index, self._mask

    def kernel_writable(self, dtype: torch.dtype) -> bool:
        """Whether the step in flight's slots can be written by the CPU kernel's plain copies
        (``cpu_kernels/step_attention.cpp``): contiguous storage on CPU in ``dtype``, row ``i``
        in slot ``i`` (an eager step: no idle rows)."""
        if self._positions is None or not self.keys:
            return False
        keys, values = self.keys[0], self.values[0]
        return (
            keys.device.type == "cpu"
            and keys.dtype == values.dtype == dtype
            and keys.is_contiguous()
            and values.is_contiguous()
            and self._positions.shape[0] == self.rows
        )

    def bind_step(self, positions: torch.Tensor, rows_index: torch.Tensor, mask: torch.Tensor) -> None:
        """Run the step in flight on these tensors instead (``[batch]``, ``[batch]``, its mask): a
        captured graph's static inputs, holding what ``begin_decode`` computed."""
        if self._mask is None or mask.shape != self._mask.shape:
            raise RuntimeError("bind_step takes tensors shaped as begin_decode's, after it")
        self._positions, self._rows_index, self._mask = positions, rows_index, mask

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one new token per row at its length; return the rows' columns up to the longest (views).

        Sizes come from the step's tensors, never from Python lists, so a compiled step sees the
        column count as a dimension (``compiled_decode.py``), not a constant.
        """
        if self._positions is None or self._rows_index is None or self._mask is None:
            raise RuntimeError("SlotKVCache takes one token per row, between begin_decode and advance")
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[self._rows_index, :, self._positions] = key_states[:, :, 0]
        values[self._rows_index, :, self._positions] = value_states[:, :, 0]
        batch, width = self._rows_index.shape[0], self._mask.shape[-1]
        return keys[:batch, :, :width], values[:batch, :, :width]

    def advance(self) -> None:
        """The forward succeeded: every row now holds one more token."""
        self.lengths = [length + 1 for length in self.lengths]
        self._positions = self._rows_index = self._mask = None

    def abandon(self) -> None:
        """The forward failed: forget it (what it wrote lies past every row's length)."""
        self._positions = self._rows_index = self._mask = None

    def join(self, batch: PaddedKVCache) -> None:
        """Append ``batch``'s rows (a prefill's padded cache), each holding its real columns only."""
        real = batch.attention_mask.bool()
        counts = real.sum(dim=1)
        longest = int(counts.max())
        start, end = self.rows, self.rows + batch.batch_size
        layers = batch.layer_tensors()
        self._reserve(end, longest, like=layers[0][0])
        if bool(real.all()):
            # No padding (a prompt prefilled alone, or equal ones): plain copies. A gather reads an
            # index per element, 2-3x the time of the copy (the long workload's usual case).
            for index, (keys, values) in enumerate(layers):
                self.keys[index][start:end, :, :longest] = keys
                self.values[index][start:end, :, :longest] = values
        else:
            # Each row's real columns in order, then padding (column 0, never read: past its length).
            order = torch.sort((~real).to(torch.int8), dim=1, stable=True).indices[:, :longest]
            for index, (keys, values) in enumerate(layers):
                gather = order[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
                self.keys[index][start:end, :, :longest] = torch.gather(keys, 2, gather)
                self.values[index][start:end, :, :longest] = torch.gather(values, 2, gather)
        self.lengths += [int(count) for count in counts.tolist()]

    @staticmethod
    def compacted(kept: list[int]) -> list[int]:
        """The order ``keep`` takes to hold the rows ``kept`` with the fewest moves: a kept row
        stays in its slot when it is still among the first ``len(kept)``, and the last rows move
        into the freed ones. Shifting every row after a leaving one down instead copied them all:
        at 16 rows of ~1,700 fp32 columns, a gather of about 1.2 GB for each finished request."""
        count = len(kept)
        movers = iter(row for row in kept if row >= count)
        staying = {row for row in kept if row < count}
        return [slot if slot in staying else next(movers) for slot in range(count)]

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order), moved down to slots ``0..len(rows)``; the slots left
        empty give their pages back (``_release_slots``)."""
        held = self.rows
        self._keep(rows)
        self._release_slots(len(rows), held)

    def _keep(self, rows: list[int]) -> None:
        if rows == list(range(len(rows))):
            self.lengths = self.lengths[: len(rows)]
            return
        if all(row == slot or row >= len(rows) for slot, row in enumerate(rows)):
            # Only rows from past the kept count move (``compacted``): each copies its own columns.
            for slot, row in enumerate(rows):
                if row != slot:
                    width = self.lengths[row]
                    for keys, values in zip(self.keys, self.values, strict=True):
                        keys[slot, :, :width] = keys[row, :, :width]
                        values[slot, :, :width] = values[row, :, :width]
        elif rows:
            width = max(self.lengths[row] for row in rows)
            index = torch.tensor(rows, dtype=torch.long, device=self.keys[0].device)
            for keys, values in zip(self.keys, self.values, strict=True):
                keys[: len(rows), :, :width] = keys[:, :, :width].index_select(0, index)
                values[: len(rows), :, :width] = values[:, :, :width].index_select(0, index)
        self.lengths = [self.lengths[row] for row in rows]
        if self._whole_slots and rows:
            # The longest row may have left: a whole-slot step would read its columns for nothing.
            tight = _round_up(max(self.lengths) + 1, WHOLE_SLOT_QUANTUM)
            if self.capacity - tight >= 2 * WHOLE_SLOT_QUANTUM:
                self._reallocate(self.slot_count, tight)

    def _release_slots(self, start: int, end: int) -> None:
        """Hand the pages of slots ``start..end``, no longer held, back to the system (CPU storage,
        memory mapped by ``zeroed``): they read as zeros again, and cost memory only once a row
        joining later writes them. Pages a kept slot shares stay."""
        if start >= end or not self.keys or self.keys[0].device.type != "cpu":
            return
        for tensor in (*self.keys, *self.values):
            slot_bytes = tensor.stride(0) * tensor.element_size()
            release_pages(tensor.data_ptr() + start * slot_bytes, (end - start) * slot_bytes)

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``row``'s KV, per layer ``[heads, tokens, dim]`` (copies: the slot is reused)."""
        length = self.lengths[row]
        return [
            (keys[row, :, :length].clone(), values[row, :, :length].clone())
            for keys, values in zip(self.keys, self.values, strict=True)
        ]

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return max(self.lengths, default=0)

    def _reserve(self, rows: int, columns: int, like: torch.Tensor | None = None) -> None:
        """Grow the storage (doubling) so ``rows`` slots of ``columns`` fit; a no-op when they do."""
        if self.keys and rows <= self.slot_count and columns <= self.capacity:
            return
        template = self.keys[0] if self.keys else like
        if template is None:
            raise RuntimeError("SlotKVCache has no storage yet and nothing to shape it on")
        # Two slots at least: a compiled step marks the slot count dynamic, and size 1 is special.
        new_rows = max(min(self._max_rows, doubled_to(rows, self.slot_count)), rows, 2)
        if self._whole_slots:
            new_columns = max(self.capacity, _round_up(columns, WHOLE_SLOT_QUANTUM))
        else:
            new_columns = doubled_to(columns, self.capacity, quantum=COLUMN_QUANTUM)
        self._reallocate(new_rows, new_columns, template)

    def _reallocate(self, rows: int, columns: int, template: torch.Tensor | None = None) -> None:
        """New storage of ``rows`` slots x ``columns``, holding what the running rows hold."""
        template = self.keys[0] if self.keys else template
        assert template is not None
        shape = (rows, template.shape[1], columns, template.shape[3])
        held = self.rows
        width = max(self.lengths, default=0)
        new_keys, new_values = [], []
        for index in range(self._num_layers):
            keys = zeroed(shape, template.dtype, template.device)
            values = zeroed(shape, template.dtype, template.device)
            if self.keys and held:
                keys[:held, :, :width] = self.keys[index][:held, :, :width]
                values[:held, :, :width] = self.values[index][:held, :, :width]
            new_keys.append(keys)
            new_values.append(values)
        self.keys, self.values = new_keys, new_values
        self.generation += 1


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros of ``shape``; on CPU in memory mapped for it, which the system zero-fills as it is first
    written (see the module docstring), so only the columns rows have held are resident."""
    if device.type != "cpu" or not hasattr(mmap, "MAP_ANONYMOUS"):  # not a POSIX system: plain zeros
        return torch.zeros(shape, dtype=dtype, device=device)
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if size == 0:
        return torch.zeros(shape, dtype=dtype)
    # The tensor keeps the map alive; it is unmapped when the last view of it goes. Detached: a
    # plain tensor to autograd, as torch.zeros' is, not a view of the flat one.
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=dtype).view(shape).detach()


def release_pages(address: int, length: int) -> None:
    """Drop the whole pages inside ``length`` bytes from ``address`` of an anonymous private map
    (``zeroed``'s); a no-op where ``madvise`` is missing."""
    page = mmap.PAGESIZE
    first = -(-address // page) * page
    last = (address + length) // page * page
    if last > first:
        advise_dontneed(first, last - first)


def doubled_to(needed: int, current: int, quantum: int = 1) -> int:
    """``current`` doubled until it holds ``needed`` (from ``quantum`` when empty), in ``quantum`` steps."""
    size = max(current, quantum)
    while size < needed:
        size *= 2
    return _round_up(size, quantum)


def _round_up(size: int, quantum: int) -> int:
    return -(-size // quantum) * quantum
