"""Owns the tie between a worker and vLLM's engine-core process: it never outlives the worker.

vLLM runs its engine core in a child process and stops it when its client shuts
down, but a worker killed with SIGKILL (the failover the queue exists for) runs no
shutdown, and the orphan would keep the cores and the KV cache. Each engine-core
process therefore watches its parent from a daemon thread and stops itself once the
parent is gone (it is re-parented): SIGTERM first, which lets vLLM release its
shared memory, SIGKILL if that has not ended it. A watch rather than
``PR_SET_PDEATHSIG``: that signal follows the parent *thread*, and the engine is
built on a thread of the loader's pool.

The watch is installed by wrapping the engine core's entry point before vLLM starts
it; with vLLM's default ``fork`` start the child inherits the wrapper, with ``spawn``
the wrapper is found by its module path.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

WATCH_INTERVAL_S = 0.5
TERM_GRACE_S = 5.0

_entry: Any = None  # vLLM's own entry point, once wrapped in this process


def tie_engine_core_to_this_process() -> None:
    """Make every engine core vLLM starts from now on stop when this process dies."""
    global _entry
    from vllm.v1.engine.core import EngineCoreProc

    if _entry is None:
        _entry = EngineCoreProc.run_engine_core
        EngineCoreProc.run_engine_core = staticmethod(run_tied_engine_core)


def run_tied_engine_core(*args: Any, **kwargs: Any) -> Any:
    """vLLM's engine-core entry point, watching the parent first (runs in the child)."""
    parent = os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()
    entry = _entry
    if entry is None:  # a spawned child: a fresh interpreter, vLLM's class unpatched
        from vllm.v1.engine.core import EngineCoreProc

        entry = EngineCoreProc.run_engine_core
    return entry(*args, **kwargs)


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(TERM_GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)
