"""Owns the one question several gateway parts ask during a drain: is this server stopping?

uvicorn stops accepting on SIGTERM and lets open responses run for its graceful
timeout; sse-starlette learns of the signal through its hook on uvicorn and gives
streams ``drain_grace_s`` before cancelling them. A stream cancelled then was not
abandoned by its client, so its job must keep running: the client resumes it on
another gateway with ``Last-Event-ID``. sse-starlette's flag is process-global by
its design; reading it here keeps that global in one place.
"""

from __future__ import annotations

from sse_starlette.sse import AppStatus


def server_is_stopping() -> bool:
    return bool(AppStatus.should_exit)
