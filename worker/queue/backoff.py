"""Owns how long the worker waits before retrying Redis through an outage (restart, failover)."""

from __future__ import annotations

_SCHEDULE_S = (0.1, 0.25, 0.5, 1.0, 2.0)  # a restart is over in ~1 s; then retry every 2 s


def outage_delay(failures: int) -> float:
    """Seconds to wait after ``failures`` consecutive failed attempts (0: the first retry)."""
    return _SCHEDULE_S[min(failures, len(_SCHEDULE_S) - 1)]
