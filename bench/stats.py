"""Owns the measurements of streamed requests and how they become per-level numbers.

Definitions (the same as vLLM's and genai-perf's where they overlap):

- TTFT: request sent -> first chunk with non-empty ``delta.content``.
- ITL: gaps between consecutive content chunks. A chunk may carry more than one
  token (the detokenizer holds back incomplete UTF-8, a batched engine may flush
  several steps at once), so ``tokens_per_chunk`` is reported next to it.
- TPOT: (last content chunk - first content chunk) / (completion_tokens - 1), per
  request: the per-token pace whatever the chunking.
- Output tokens come from ``usage.completion_tokens`` (``stream_options.include_usage``).
  A request cut off by ``--max-seconds-per-level`` has no usage; its content-chunk
  count stands in (a lower bound when chunks carry several tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any


@dataclass
class RequestRecord:
    """One streamed request, filled in as its chunks arrive (so a cancelled one keeps what it got)."""

    index: int
    started_at: float
    chunk_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    completion_tokens: int | None = None
    error: str | None = None
    truncated: bool = False
    content: str = ""  # the streamed text (the structured-output phase checks it is JSON)

    @property
    def tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.chunk_times)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.started_at if self.chunk_times else None

    def inter_chunk_gaps(self) -> list[float]:
        return [later - earlier for earlier, later in pairwise(self.chunk_times)]

    def tpot_s(self) -> float | None:
        if self.completion_tokens is None or self.completion_tokens < 2 or len(self.chunk_times) < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.completion_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def summarize_level(records: Sequence[RequestRecord], wall_s: float, expected_tokens: int) -> dict[str, Any]:
    """Throughput and latency figures of one sweep level, in the JSON line's field names."""
    tokens = sum(record.tokens for record in records if record.error is None)
    ttfts = [ttft for record in records if record.error is None and (ttft := record.ttft_s) is not None]
    gaps = [gap for record in records if record.error is None for gap in record.inter_chunk_gaps()]
    tpots = [tpot for record in records if record.error is None and (tpot := record.tpot_s()) is not None]
    chunks = sum(len(record.chunk_times) for record in records if record.error is None)
    complete = [record for record in records if record.error is None and not record.truncated]
    return {
        "requests_sent": len(records),
        "requests_completed": len(complete),
        "errors": sum(record.error is not None for record in records),
        "truncated_requests": sum(record.truncated for record in records),
        "no_first_token": sum(record.error is None and record.ttft_s is None for record in records),
        "short_requests": sum(record.tokens < expected_tokens for record in complete),
        "output_tokens": tokens,
        "wall_s": round(wall_s, 3),
        "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "ttft_ms_p50": _ms(percentile(ttfts, 50)),
        "ttft_ms_p99": _ms(percentile(ttfts, 99)),
        "itl_ms_p50": _ms(percentile(gaps, 50)),
        "itl_ms_p99": _ms(percentile(gaps, 99)),
        "tpot_ms_p50": _ms(percentile(tpots, 50)),
        "tpot_ms_p99": _ms(percentile(tpots, 99)),
        "tokens_per_chunk": round(tokens / chunks, 3) if chunks else None,
        "first_errors": sorted({record.error for record in records if record.error})[:3],
    }
