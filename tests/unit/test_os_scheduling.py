"""Relay processes under SCHED_BATCH: every thread of the process moves, and threads it starts follow."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from shared.os_scheduling import batch_threads, worker_batches

# A process with a second thread, which starts a third once told to (a line on stdin).
_CHILD = """
import sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("started", flush=True)
time.sleep(60)
"""


def _policies(pid: int) -> list[int]:
    return [os.sched_getscheduler(thread.id) for thread in psutil.Process(pid).threads()]


def test_every_thread_moves_and_later_threads_inherit_it() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        assert _policies(child.pid) == [os.SCHED_OTHER] * 2
        assert batch_threads(child.pid) == 2
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 10
        while len(_policies(child.pid)) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _policies(child.pid) == [os.SCHED_BATCH] * 3
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller itself is left alone
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_moves_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert batch_threads(child.pid) == 0


def test_only_a_worker_whose_model_computes_elsewhere_batches_by_default() -> None:
    assert worker_batches("auto", "vllm")
    assert not worker_batches("auto", "transformers")  # its step loop waits on each publish
    assert not worker_batches("auto", "fake")
    assert worker_batches("batch", "transformers")
    assert not worker_batches("normal", "vllm")
