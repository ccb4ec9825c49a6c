"""Owns logging set-up: text or JSON lines, each carrying the request id of its context.

Only entry points call ``configure_logging``; modules just use
``logging.getLogger(__name__)``. The request id travels in a contextvar, so a
line logged anywhere inside a request's task carries it without being passed.
The gateway passes the same id to the worker inside the job, so the lines of one
request carry one id in every process.

``--log-format json`` writes one object per line: ``ts``, ``level``, ``logger``,
``message``, ``request_id`` (null outside a request), ``process`` (gateway or
worker), ``host``, ``pid``, and ``worker_id`` when one was configured.
``text`` stays readable for people. Prompts, outputs and keys are never logged
at INFO; token ids and text appear only at DEBUG, which is opt-in.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")

_TEXT_FORMAT = "%(asctime)s %(levelname)-5s %(name)s [%(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``fields`` (process, worker_id) are added to every line."""

    def __init__(self, fields: dict[str, str] | None = None) -> None:
        super().__init__()
        self._fields = {"host": socket.gethostname(), **(fields or {})}

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", "-")
        line: dict[str, object] = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": None if request_id == "-" else request_id,
            **self._fields,
            "pid": record.process,
        }
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure_logging(level: str = "INFO", fmt: str = "text", **fields: str) -> None:
    """Log to stderr as ``text`` or ``json``; ``fields`` (process=..., worker_id=...) go in JSON lines."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter(fields) if fmt == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Third-party chatter stays at WARNING unless the operator asks for DEBUG.
    for noisy in ("httpx", "httpcore", "urllib3", "filelock", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.getLevelName(level), logging.WARNING))
    if root.isEnabledFor(logging.DEBUG):
        # Say so at the top of the log: DEBUG lines carry user data that INFO never does.
        logging.getLogger(__name__).warning("DEBUG logging is on: prompts and generated text will be logged")


@contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Tag log lines with ``request_id`` inside a loop that serves many requests."""
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)
