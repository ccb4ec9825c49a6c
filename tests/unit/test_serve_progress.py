"""``tokenferry serve`` says it is still loading the model while it waits, and a worker logs its downloads."""

from __future__ import annotations

import io
import logging

import pytest

from cli.serve import PROGRESS_EVERY_S, LoadingProgress, loading_line
from worker.model.progress import LoggedProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_serve_says_at_once_then_every_few_seconds_that_the_model_is_loading() -> None:
    clock, out = Clock(), io.StringIO()
    progress = LoadingProgress("org/big-model", clock=clock, out=out)
    for _ in range(3):  # polls well inside one period print one line
        progress.tick()
        clock.now += 0.5
    clock.now = 100.0 + PROGRESS_EVERY_S + 2
    progress.tick()
    progress.tick()

    assert out.getvalue().splitlines() == [
        "tokenferry serve: loading model org/big-model... (a first start may download or convert it)",
        f"tokenferry serve: loading model org/big-model... ({PROGRESS_EVERY_S + 2:.0f} s)",
    ]


def test_the_loading_line_counts_whole_seconds() -> None:
    assert loading_line("m", 41.6) == "tokenferry serve: loading model m... (42 s)"


def test_a_download_off_a_terminal_is_reported_as_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="worker.model.progress"):
        bar = LoggedProgress(total=2_000_000, desc="model.safetensors", unit="B", unit_scale=True, name="hub")
        bar.update(1_000_000)
        bar.update(1_000_000)
        bar.close()

    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].startswith("model.safetensors:   0%")
    assert lines[-1].startswith("model.safetensors: 100%") and "2.00M/2.00M" in lines[-1]
