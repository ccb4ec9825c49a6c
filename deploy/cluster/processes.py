"""Owns the cluster's child processes: start each in its own session, stop them all, leave none behind.

Each child leads a new session (and so a process group): Ctrl-C in the terminal
reaches only the supervisor, which then stops the tiers in order (nginx first,
Redis last) instead of every process dying at once mid-drain. Stopping sends
SIGTERM to each child, waits up to a deadline (workers drain their running
sequences first), then SIGKILLs the whole group of any that overran, and finally
sweeps every group so no grandchild (an nginx worker, say) outlives the cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Child:
    name: str
    process: subprocess.Popen[bytes]


def spawn(name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
    return Child(name, subprocess.Popen(list(argv), env=env, start_new_session=True))


def first_exited(children: Sequence[Child]) -> Child | None:
    return next((child for child in children if child.process.poll() is not None), None)


def stop(children: Sequence[Child], timeout_s: float) -> None:
    """SIGTERM all of ``children`` together, SIGKILL what is left at the deadline, sweep their groups."""
    for child in children:
        if child.process.poll() is None:
            child.process.terminate()
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(child)
            child.process.wait()
    for child in children:
        _kill_group(child)


def _kill_group(child: Child) -> None:
    # The group id is the child's pid (start_new_session); it is gone once every member is.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, signal.SIGKILL)
