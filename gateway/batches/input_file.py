"""Owns reading a batch's input file from Redis a piece at a time, checking it off the event loop.

The runner never holds a whole input file, nor its parsed lines: validation reads
it in chunks of whole lines (``CHUNK_BYTES`` at a time, by ``GETRANGE``) and checks
each on a thread (``gateway/batches/input_check.py``), so the gateway's event loop
(its routes, the runner renewing its leases) runs on between chunks and beside
them; a running batch then reads back only the lines it is starting, by their
place in the file's ``LineIndex``. The file is immutable, so what is read later is
what was validated; a file deleted or expired under its batch raises
``InputFileGone``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from gateway.batches.files import FileStore
from gateway.batches.input_check import FileCheck, LineIndex, custom_ids_in, lines_in
from gateway.batches.lines import LineRules, ParsedLine
from shared.errors import TokenferryError

# How much of a file one read brings (a line longer than this is read in several).
CHUNK_BYTES = 1 << 20


class InputFileGone(Exception):
    """The batch's input file was deleted (or expired) before the batch was done with it."""


class InputFile:
    """The input file of one batch, read a piece at a time."""

    def __init__(self, files: FileStore, file_id: str) -> None:
        self._files = files
        self._file_id = file_id

    async def validate(
        self, rules: LineRules, still_wanted: Callable[[], Awaitable[bool]]
    ) -> tuple[LineIndex, str] | None:
        """The file's index and model once every line passes (``InvalidBatchFile`` otherwise); None
        when ``still_wanted`` says no between chunks (the batch was cancelled)."""
        check = FileCheck(rules)
        async for offset, chunk in self._chunks():
            await asyncio.to_thread(check.feed, chunk, offset)
            if check.full:
                break
            if not await still_wanted():
                return None
        return check.finish()

    async def index(self) -> LineIndex:
        """The index of a file validated before (a runner taking a batch over): no line is parsed."""
        index = LineIndex()
        async for offset, chunk in self._chunks():
            await asyncio.to_thread(_exhaust, index.add(chunk, offset))
        return index

    async def lines(
        self, index: LineIndex, first: int, count: int, rules: LineRules
    ) -> list[ParsedLine | TokenferryError]:
        """Lines ``first`` to ``first + count - 1``, read and checked again (see ``lines_in``)."""
        window = await self._range(*index.span(first, count))
        return await asyncio.to_thread(lines_in, window, index.numbers(first, count), rules)

    async def custom_ids(self, index: LineIndex, first: int, count: int, endpoint: str) -> list[str]:
        window = await self._range(*index.span(first, count))
        return await asyncio.to_thread(custom_ids_in, window, endpoint)

    async def _chunks(self) -> AsyncIterator[tuple[int, bytes]]:
        """The file as (offset, chunk) pairs, each chunk whole lines (the last may lack its newline)."""
        size = await self._files.size(self._file_id)
        if size is None:
            raise InputFileGone(self._file_id)
        start, read = 0, 0
        pieces: list[bytes] = []
        while read < size:
            piece = await self._range(read, min(size, read + CHUNK_BYTES))
            read += len(piece)
            pieces.append(piece)
            if b"\n" not in piece and read < size:
                continue  # a long line: its end is in a later piece
            buffer = b"".join(pieces)
            cut = len(buffer) if read >= size else buffer.rfind(b"\n") + 1
            yield start, buffer[:cut]
            start, pieces = start + cut, [buffer[cut:]]

    async def _range(self, start: int, end: int) -> bytes:
        content = await self._files.content_range(self._file_id, start, end)
        if content is None or len(content) != end - start:
            raise InputFileGone(self._file_id)
        return content


def _exhaust(lines: Iterator[tuple[int, bytes]]) -> None:
    for _ in lines:
        pass
