"""Owns checking a whole batch input file a piece at a time, and where each of its lines lies.

A file is validated whole before any line runs, as OpenAI does: every line must
pass ``gateway/batches/lines.py``'s ``checked_line``, have a ``custom_id`` no
other line has, and name the model the first line names. Problems are collected
per line (``BatchError.line`` is 1-based) instead of stopping at the first; a file
with any fails its batch, with ``errors`` naming them.

``FileCheck`` is fed the file in chunks of whole lines (``gateway/batches/input_file.py``
reads them from Redis and feeds each on a thread, off the event loop) and keeps
only what later lines need: the ``custom_id``s seen, the model, the first
``MAX_REPORTED_ERRORS`` problems, and a ``LineIndex``. Parsed requests are
dropped at once: a running batch reads and checks its lines again, a window at a
time, as it starts them (``lines_in``). Lines end with ``\\n`` (``\\r\\n`` too);
blank lines are skipped and do not count as lines of the batch.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

from gateway.batches.lines import LineRules, ParsedLine, checked_line, envelope
from gateway.batches.schema import BatchError
from shared.errors import InvalidRequest, TokenferryError

# Past this many, the rest of a broken file is not checked: its batch fails anyway.
MAX_REPORTED_ERRORS = 100
# Offsets and line numbers of a file under 4 GiB (max_file_bytes is at most 512 MiB): 4 bytes each.
_UINT = "I"


class InvalidBatchFile(Exception):
    """The input file cannot run; ``errors`` name each bad line."""

    def __init__(self, errors: list[BatchError]) -> None:
        super().__init__(f"{len(errors)} problem(s) in the input file")
        self.errors = errors


class LineIndex:
    """Where each line of a batch lies in its input file: 8 bytes a line, not the line."""

    def __init__(self) -> None:
        self._starts = array(_UINT)
        self._numbers = array(_UINT)
        self._end = 0
        self._number = 0

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, chunk: bytes, offset: int) -> Iterator[tuple[int, bytes]]:
        """Index ``chunk`` (whole lines from byte ``offset``), giving each line's number and bytes."""
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            end = len(chunk) if end < 0 else end
            self._number += 1
            raw = chunk[start:end]
            if raw.strip():
                self._starts.append(offset + start)
                self._numbers.append(self._number)
                yield self._number, raw
            start = end + 1
        self._end = offset + len(chunk)

    def span(self, first: int, count: int) -> tuple[int, int]:
        """The bytes (start, end exclusive) holding lines ``first`` to ``first + count - 1``."""
        last = first + count
        return self._starts[first], self._starts[last] if last < len(self) else self._end

    def numbers(self, first: int, count: int) -> list[int]:
        return list(self._numbers[first : first + count])


class FileCheck:
    """One input file being checked, fed chunk by chunk; ``finish`` gives its ``LineIndex``."""

    def __init__(self, rules: LineRules) -> None:
        self._rules = rules
        self._index = LineIndex()
        self._seen: set[str] = set()
        self._model: tuple[int, str] | None = None  # the first line's number and model
        self._errors: list[BatchError] = []

    @property
    def full(self) -> bool:
        """Enough problems are listed: the rest of the file need not be checked."""
        return len(self._errors) >= MAX_REPORTED_ERRORS

    def feed(self, chunk: bytes, offset: int) -> None:
        """Check the whole lines of ``chunk``, which starts at byte ``offset`` of the file."""
        for number, raw in self._index.add(chunk, offset):
            if not self.full:
                self._check(number, raw)

    def finish(self) -> tuple[LineIndex, str]:
        """The file's index and model; ``InvalidBatchFile`` naming its problems."""
        if self._model is None and not self._errors:
            self._errors.append(BatchError(code="empty_file", message="The input file has no lines."))
        if self._errors or self._model is None:
            raise InvalidBatchFile(self._errors[:MAX_REPORTED_ERRORS])
        return self._index, self._model[1]

    def _check(self, number: int, raw: bytes) -> None:
        try:
            line = checked_line(number, raw, self._rules)
            if line.custom_id in self._seen:
                raise InvalidRequest(f"Duplicate custom_id '{line.custom_id}'.", param="custom_id")
        except TokenferryError as error:
            problem = BatchError(
                code="invalid_request", message=error.message, param=error.param, line=number
            )
            self._errors.append(problem)
            return
        self._seen.add(line.custom_id)
        self._check_model(line)

    def _check_model(self, line: ParsedLine) -> None:
        """One model per batch, like OpenAI: the lines run on that model's batch queue."""
        if self._model is None:
            self._model = (line.number, line.request.model)
        elif line.request.model != self._model[1]:
            first, model = self._model
            message = f"Every line must use the same model; line {first} uses '{model}'."
            problem = BatchError(
                code="mismatched_model", message=message, param="body.model", line=line.number
            )
            self._errors.append(problem)


def lines_in(window: bytes, numbers: list[int], rules: LineRules) -> list[ParsedLine | TokenferryError]:
    """The lines of ``window`` (bytes a ``LineIndex.span`` named) checked again, like
    ``gather(return_exceptions=True)``: each a line, or why it is refused now (the gateway
    running the batch may have other caps than the one that validated it)."""
    found = [raw for raw in window.split(b"\n") if raw.strip()]
    if len(found) != len(numbers):
        raise ValueError(f"the input file changed: {len(found)} lines where {len(numbers)} were indexed")
    parsed: list[ParsedLine | TokenferryError] = []
    for number, raw in zip(numbers, found, strict=True):
        try:
            parsed.append(checked_line(number, raw, rules))
        except TokenferryError as error:
            parsed.append(error)
    return parsed


def custom_ids_in(window: bytes, endpoint: str) -> list[str]:
    """The ``custom_id`` of each line of ``window``, for the error lines of lines that never ran."""
    return [envelope(raw, endpoint).custom_id for raw in window.split(b"\n") if raw.strip()]
