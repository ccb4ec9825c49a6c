"""Owns what a worker shows while it downloads a model: the hub's progress bars, or log lines.

On a terminal huggingface_hub draws its own bars. Elsewhere (a container's log, a
file, ``tokenferry serve`` under a test) it draws nothing, and a multi-GB download
looks like a hang; ``LoggedProgress`` then reports each file as a log line at most
every ``LOG_EVERY_S`` seconds, and once when it ends.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

logger = logging.getLogger(__name__)

LOG_EVERY_S = 10.0


class _Discard:
    """A file that drops what tqdm writes: the lines go to the log instead."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class LoggedProgress(tqdm):  # type: ignore[misc]  # tqdm ships no types
    """A tqdm bar whose every display is one log line, at most every ``LOG_EVERY_S`` seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("name", None)  # huggingface_hub's own bar takes a group name; tqdm refuses it
        kwargs.update(mininterval=LOG_EVERY_S, file=_Discard(), disable=False)
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        line = str(self) if msg is None else msg
        if line.strip():
            logger.info("%s", line.strip())
        return True


def download_progress() -> type[LoggedProgress] | None:
    """The progress class for hub downloads: None (the hub's own bars) on a terminal, else log lines."""
    return None if sys.stderr.isatty() else LoggedProgress
