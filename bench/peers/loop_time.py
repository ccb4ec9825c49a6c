"""Owns the worker loop's share of a level: how long the engine waited between steps for it.

A tokenferry worker exports ``tokenferry_worker_step_gap_seconds`` (from the end of one
step to the start of the next while sequences run: routing, publishing and admission on
the worker's loop) beside ``tokenferry_worker_step_duration_seconds``. Read before and
after a level, their sums give ``loop_share`` = gaps / (gaps + steps): the part of the
engine's busy time it spent waiting for its own loop (issue 18's "lean loop": under 5% at
c=32), and ``step_ms_mean``, the mean step as served. Two parts of the gap are timed apart
(``route_duration_seconds``, ``publish_duration_seconds``): ``route_share`` and
``publish_share`` over the same busy time. vLLM's server has no such metric: its rows get none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

_GAPS = "tokenferry_worker_step_gap_seconds_sum"
_STEPS = "tokenferry_worker_step_duration_seconds_sum"
_STEP_COUNT = "tokenferry_worker_step_duration_seconds_count"
_ROUTE = "tokenferry_worker_route_duration_seconds_sum"
_PUBLISH = "tokenferry_worker_publish_duration_seconds_sum"


@dataclass(frozen=True)
class LoopTime:
    """The two sums, in seconds, at one moment."""

    gaps_s: float
    steps_s: float
    steps: int = 0
    route_s: float = 0.0
    publish_s: float = 0.0


def parse(text: str) -> LoopTime | None:
    """The sums from a Prometheus text page (one model per worker), or None where absent."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in (_GAPS, _STEPS, _STEP_COUNT, _ROUTE, _PUBLISH):
            sums[name] = sums.get(name, 0.0) + float(rest.rsplit(" ", 1)[1])
    if _GAPS not in sums or _STEPS not in sums:
        return None
    steps = int(sums.get(_STEP_COUNT, 0))
    return LoopTime(sums[_GAPS], sums[_STEPS], steps, sums.get(_ROUTE, 0.0), sums.get(_PUBLISH, 0.0))


async def read(metrics_url: str | None) -> LoopTime | None:
    """The worker's sums now; None without a metrics URL or when they cannot be read."""
    if metrics_url is None:
        return None
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(metrics_url)
            response.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse(response.text)


def share(before: LoopTime | None, after: LoopTime | None) -> dict[str, Any]:
    """``loop_share``, ``loop_gap_s``, the mean step (``step_ms_mean``), ``route_share`` and
    ``publish_share`` over the interval, or nothing when either read failed."""
    if before is None or after is None:
        return {}
    gaps, steps = after.gaps_s - before.gaps_s, after.steps_s - before.steps_s
    if gaps + steps <= 0:
        return {}
    busy = gaps + steps
    fields = {"loop_share": round(gaps / busy, 4), "loop_gap_s": round(gaps, 3)}
    fields["route_share"] = round((after.route_s - before.route_s) / busy, 4)
    fields["publish_share"] = round((after.publish_s - before.publish_s) / busy, 4)
    if (count := after.steps - before.steps) > 0:
        fields["step_ms_mean"] = round(steps / count * 1000, 2)
    return fields
