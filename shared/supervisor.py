"""Owns child processes: start each in its own group, wait until ready, signal, stop, leave none behind.

``tokenferry serve``, ``deploy.cluster``, the benchmarks and the tests that run real
processes all start children, wait for them, signal and stop them through here.

- A ``Child`` leads a new session, and so a process group of its own: Ctrl-C in the
  terminal reaches only the supervising process, which then stops its children in
  order instead of every process dying at once mid-drain. Tests opt out
  (``own_session=False``) so that a Ctrl-C also reaches what a test started even when
  pytest skips a fixture's teardown.
- ``wait_until`` polls a readiness condition (an HTTP probe, a Redis ping, a line in a
  log: any callable) until a deadline, and fails at once when a child exits meanwhile.
- ``stop`` sends SIGTERM to children together, waits one grace period (workers drain
  their running sequences), SIGKILLs the group of any that overran, then sweeps every
  group so that no grandchild (an nginx worker, say) outlives its parent.
- A ``Supervisor`` owns several children and stops them all on exit, the last started
  first; callers that stop tiers in order (nginx, then gateways and workers, then
  Redis) hold one supervisor per tier.

Intentional divergence from "composition over inheritance": ``Child`` subclasses
``subprocess.Popen``. A child is a process, and its callers (tests above all) use the
whole ``Popen`` API on it (``send_signal``, ``wait``, ``communicate``, ``stdout``);
the subclass only adds a name and its process group.

Synchronous on purpose: every caller waits in a plain blocking loop (the chaos bench,
the one async caller, runs its own async readiness check).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, TypeVar

T = TypeVar("T")

# Where a child's stdout goes: a log file's path (appended to), an open file,
# subprocess.PIPE or DEVNULL, or None to inherit the supervisor's.
Output = Path | IO[bytes] | int | None


class SupervisorError(RuntimeError):
    """A child exited while it was awaited, or it was not ready in time."""


class ChildExited(SupervisorError):
    def __init__(self, child: Child) -> None:
        super().__init__(f"{child.name} exited with code {child.returncode} during start-up")
        self.child = child


class NotReady(SupervisorError):
    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(f"{what} was not ready within {timeout_s:.0f} s")


class StopRequested(Exception):
    """A stop was requested (Ctrl-C or SIGTERM, see ``stop_on_signals``) while waiting."""


class Child(subprocess.Popen[bytes]):
    """One named child process, leading its own process group unless ``own_session`` is false.

    With an ``output``, stderr joins stdout there unless ``stderr`` says otherwise.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        output: Output = None,
        stderr: int | None = None,
        cwd: Path | None = None,
        own_session: bool = True,
    ) -> None:
        self.name = name
        self.owns_group = own_session
        if stderr is None and output is not None:
            stderr = subprocess.STDOUT
        with _opened(output) as stdout:  # the child keeps its own descriptor
            super().__init__(
                list(argv), stdout=stdout, stderr=stderr, env=env, cwd=cwd, start_new_session=own_session
            )

    def kill_group(self) -> None:
        """SIGKILL the child and, if it leads one, every process left in its group."""
        if not self.owns_group:
            with contextlib.suppress(ProcessLookupError):
                self.kill()
            return
        # The group id is the child's pid; the group is gone once every member is.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def stop(self, grace_s: float) -> None:
        stop([self], grace_s)


@contextlib.contextmanager
def _opened(output: Output) -> Iterator[IO[bytes] | int | None]:
    if isinstance(output, Path):
        with output.open("ab") as log:
            yield log
    else:
        yield output


def cli_command(*argv: str) -> list[str]:
    """``tokenferry <argv>`` as this interpreter runs it (``python -m cli``): children share its venv.

    Never put a secret (a Redis password, an API key) in ``argv``: any local user reads
    command lines (``ps``). Pass it as a ``TOKENFERRY_*`` variable (``with_environment``).
    """
    return [sys.executable, "-m", "cli", *argv]


def with_environment(values: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus ``values``: how a child receives secrets."""
    return {**os.environ, **values}


def first_exited(children: Iterable[Child]) -> Child | None:
    return next((child for child in children if child.poll() is not None), None)


def wait_until(
    condition: Callable[[], T],
    children: Iterable[Child],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.5,
    stop_event: threading.Event | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    Raises ``ChildExited`` when one of ``children`` exits first, ``NotReady`` at the
    deadline, ``StopRequested`` once ``stop_event`` is set. A condition that raises
    ``OSError`` (nothing listens yet) or ``ValueError`` (a half-started reply) is not
    ready yet.
    """
    watched = list(children)
    pause = stop_event or threading.Event()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = first_exited(watched)
        if exited is not None:
            raise ChildExited(exited)
        with contextlib.suppress(OSError, ValueError):
            answer = condition()
            if answer:
                return answer
        if pause.wait(interval_s):
            raise StopRequested
    raise NotReady(what, timeout_s)


def watch(children: Iterable[Child], stop_event: threading.Event, interval_s: float = 0.5) -> Child | None:
    """Block until one of ``children`` exits (return it) or ``stop_event`` is set (return None)."""
    watched = list(children)
    while True:
        exited = first_exited(watched)
        if exited is not None:
            return exited
        if stop_event.wait(interval_s):
            return None


def stop(children: Iterable[Child], grace_s: float) -> None:
    """SIGTERM every live child together, SIGKILL the group of any left at the deadline, sweep every group."""
    stopping = list(children)
    for child in stopping:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace_s
    for child in stopping:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill_group()
            child.wait()
    for child in stopping:
        if child.owns_group:
            child.kill_group()


class Supervisor:
    """Owns several children: starts them, waits until they are ready, stops them all together on exit."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.children: list[Child] = []

    def start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, output: Output = None
    ) -> Child:
        child = Child(name, argv, env=env, output=output)
        self.children.append(child)
        return child

    def wait_until(
        self,
        condition: Callable[[], T],
        *,
        timeout_s: float,
        what: str,
        interval_s: float = 0.5,
        stop_event: threading.Event | None = None,
    ) -> T:
        """``wait_until`` over this supervisor's children."""
        return wait_until(
            condition,
            self.children,
            timeout_s=timeout_s,
            what=what,
            interval_s=interval_s,
            stop_event=stop_event,
        )

    def watch(self, stop_event: threading.Event, interval_s: float = 0.5) -> Child | None:
        return watch(self.children, stop_event, interval_s)

    def stop(self) -> None:
        """Stop every child, the last started first (a gateway before the worker behind it)."""
        stop(reversed(self.children), self.grace_s)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def stop_on_signals() -> threading.Event:
    """An event set by Ctrl-C or SIGTERM, polled by the wait loops (raising in a handler can cut a write)."""
    event = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        event.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    return event


@contextlib.contextmanager
def ctrl_c_ignored() -> Iterator[None]:
    """Ignore Ctrl-C while stopping: a second one must not abandon the children."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler Python did not install, which it cannot restore
            signal.signal(signal.SIGINT, previous)


def get_json(url: str, timeout_s: float = 2.0) -> dict[str, object]:
    """``url``'s JSON object; ``OSError`` or ``ValueError`` while the server is not up yet."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            loaded = json.load(response)
    except http.client.HTTPException as error:  # a reply cut short: not an OSError
        raise OSError(f"{url}: {error!r}") from error
    if not isinstance(loaded, dict):
        raise ValueError(f"{url} answered {loaded!r}")
    return loaded


def served_models(base_url: str, timeout_s: float = 2.0) -> list[str]:
    """The model ids a gateway at ``base_url`` lists on ``/v1/models`` (empty until a worker registers)."""
    data = get_json(f"{base_url}/v1/models", timeout_s).get("data")
    if not isinstance(data, list):
        raise ValueError(f"{base_url}/v1/models answered without a model list")
    return [str(entry["id"]) for entry in data if isinstance(entry, dict) and "id" in entry]
