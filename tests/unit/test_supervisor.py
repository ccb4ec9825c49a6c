"""The supervisor with real tiny children (``python -c``): readiness, early deaths, escalation, groups."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from shared.supervisor import (
    Child,
    ChildExited,
    NotReady,
    StopRequested,
    Supervisor,
    wait_until,
)

# Prints "ready" after a short start-up, then runs until stopped.
_SLOW_START = "import time; time.sleep(0.3); print('ready', flush=True); time.sleep(60)"
# Ignores SIGTERM: only SIGKILL ends it.
_STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    "time.sleep(60)"
)
# Starts a grandchild in its own group and says its pid.
_PARENT = (
    "import subprocess, sys, time; "
    "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(grandchild.pid, flush=True); time.sleep(60)"
)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # a dead child nobody reaped yet
    except psutil.NoSuchProcess:
        return True


def _logged(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def test_wait_until_returns_the_condition_once_the_child_is_ready(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    with Supervisor(grace_s=5) as supervisor:
        supervisor.start("slow", _python(_SLOW_START), output=log)
        started = time.monotonic()
        answer = supervisor.wait_until(
            lambda: "ready" in _logged(log) and "yes", timeout_s=10, what="slow", interval_s=0.05
        )
        assert answer == "yes"
        assert time.monotonic() - started >= 0.2


def test_a_condition_raising_oserror_or_valueerror_is_not_ready_yet() -> None:
    calls: list[int] = []

    def flaky() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionRefusedError
        if len(calls) == 2:
            raise ValueError("half a reply")
        return True

    assert wait_until(flaky, [], timeout_s=5, what="flaky", interval_s=0.01) is True
    assert len(calls) == 3


def test_a_child_that_dies_before_it_is_ready_fails_the_wait_at_once() -> None:
    with Supervisor(grace_s=5) as supervisor:
        supervisor.start("doomed", _python("import sys; sys.exit(3)"))
        started = time.monotonic()
        with pytest.raises(ChildExited, match="doomed exited with code 3 during start-up") as failure:
            supervisor.wait_until(lambda: False, timeout_s=30, what="doomed", interval_s=0.05)
        assert failure.value.child.returncode == 3
        assert time.monotonic() - started < 10


def test_a_deadline_passed_raises_not_ready_naming_what_was_awaited() -> None:
    with pytest.raises(NotReady, match="the gateway was not ready within 0 s"):
        wait_until(lambda: False, [], timeout_s=0.2, what="the gateway", interval_s=0.05)


def test_a_stop_event_ends_the_wait() -> None:
    stop_event = threading.Event()
    threading.Timer(0.2, stop_event.set).start()
    with pytest.raises(StopRequested):
        wait_until(lambda: False, [], timeout_s=30, what="never", interval_s=0.05, stop_event=stop_event)


def test_stop_escalates_to_sigkill_for_a_child_ignoring_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    child = Child("stubborn", _python(_STUBBORN), output=log)
    wait_until(lambda: "ready" in _logged(log), [child], timeout_s=10, what="stubborn", interval_s=0.05)
    started = time.monotonic()
    child.stop(grace_s=0.5)
    assert child.returncode == -signal.SIGKILL
    assert 0.4 <= time.monotonic() - started < 10


def test_a_child_that_heeds_sigterm_ends_by_it() -> None:
    child = Child("polite", _python("import time; time.sleep(60)"))
    child.stop(grace_s=10)
    assert child.returncode == -signal.SIGTERM


def test_stopping_a_child_leaves_no_grandchild_behind(tmp_path: Path) -> None:
    log = tmp_path / "parent.log"
    child = Child("parent", _python(_PARENT), output=log)
    wait_until(lambda: _logged(log).strip(), [child], timeout_s=10, what="parent", interval_s=0.05)
    grandchild = int(_logged(log).strip())
    assert not _gone(grandchild)
    child.stop(grace_s=5)
    deadline = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild)


def test_a_supervisor_stops_every_child_on_exit_even_on_an_error() -> None:
    with pytest.raises(RuntimeError), Supervisor(grace_s=5) as supervisor:
        sleeper = _python("import time; time.sleep(60)")
        children = [supervisor.start(f"c{index}", sleeper) for index in range(3)]
        raise RuntimeError("the caller failed")
    assert [child.returncode for child in children] == [-signal.SIGTERM] * 3


def test_watch_returns_the_child_that_exited() -> None:
    with Supervisor(grace_s=5) as supervisor:
        supervisor.start("steady", _python("import time; time.sleep(60)"))
        quitter = supervisor.start("quitter", _python("import time; time.sleep(0.2)"))
        assert supervisor.watch(threading.Event(), interval_s=0.05) is quitter


def test_each_child_leads_its_own_process_group() -> None:
    child = Child("leader", _python("import time; time.sleep(60)"))
    try:
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    finally:
        child.stop(grace_s=5)
