"""Owns the worker's probes: ``GET /health`` and ``GET /ready`` beside ``/metrics`` on its HTTP port.

An orchestrator needs two answers a heartbeat in Redis cannot give it:

* ``/health`` (liveness, and the startup probe): 200 while the engine loop runs.
  503 while the model loads (the startup probe waits that out) and once the
  engine loop has ended, when only a restart helps. It never asks Redis: a Redis
  outage must not restart every worker at once.
* ``/ready`` (readiness): 200 once the model is loaded and warmed up and the
  worker is registered, so a rolling update removes an old pod only when its
  replacement can serve; 503 before that, and again from the start of a drain.

``Probes`` is written from the event loop and read by the HTTP server's threads;
each answer reads one attribute, which is atomic in CPython. The server itself is
prometheus_client's WSGI machinery: ``serve_wsgi`` runs ``Probes.route`` in front
of the exposition app, in daemon threads, quiet per request like prometheus_client's.
"""

from __future__ import annotations

import asyncio
import enum
import json
import socket
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from shared.errors import Unavailable

# The WSGI signature, kept loose: wsgiref's own types are only for type checkers.
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Phase(enum.Enum):
    LOADING = "loading the model"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "the engine loop has stopped"


class Probes:
    """Where this worker is in its life, as /health and /ready answer it."""

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id
        self._phase = Phase.LOADING

    @property
    def phase(self) -> Phase:
        return self._phase

    def serving(self, engine_loop: asyncio.Task[None]) -> None:
        """The model is loaded and warmed up, the worker registered and ``engine_loop`` started."""
        self._phase = Phase.SERVING
        engine_loop.add_done_callback(self._engine_loop_ended)

    def draining(self) -> None:
        if self._phase is Phase.SERVING:
            self._phase = Phase.DRAINING

    def _engine_loop_ended(self, _task: asyncio.Task[None]) -> None:
        self._phase = Phase.STOPPED

    def health(self) -> tuple[HTTPStatus, dict[str, Any]]:
        phase = self._phase
        if phase in (Phase.SERVING, Phase.DRAINING):
            return HTTPStatus.OK, {"status": "ok"}
        return HTTPStatus.SERVICE_UNAVAILABLE, _unavailable(f"Not alive: {phase.value}.")

    def readiness(self) -> tuple[HTTPStatus, dict[str, Any]]:
        phase = self._phase
        if phase is Phase.SERVING:
            return HTTPStatus.OK, {"status": "ready", "worker_id": self._worker_id}
        return HTTPStatus.SERVICE_UNAVAILABLE, _unavailable(f"Not ready: {phase.value}.")

    def route(self, fallback: WSGIApp) -> WSGIApp:
        """A WSGI app answering /health and /ready itself and every other path with ``fallback``."""
        answers = {"/health": self.health, "/ready": self.readiness}

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            answer = answers.get(environ.get("PATH_INFO", ""))
            if answer is None:
                return fallback(environ, start_response)
            status, body = answer()
            payload = json.dumps(body).encode()
            headers = [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
            start_response(f"{status.value} {status.phrase}", headers)
            return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else payload]

        return app


def _unavailable(message: str) -> dict[str, Any]:
    """OpenAI's error object, as the gateway's /ready answers its 503."""
    return {"error": Unavailable(message).to_info().model_dump(exclude={"status"})}


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    # Daemon threads: a slow scraper never holds the process's exit.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        """Probes and scrapes every few seconds would drown the worker's own log lines."""


def serve_wsgi(app: WSGIApp, port: int, host: str) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``app`` on ``host:port`` (0: a free port) from a daemon thread, IPv6 hosts included."""

    class Server(_ThreadingServer):
        pass

    family, *_, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    Server.address_family = family
    server = make_server(str(address[0]), port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="worker-http", daemon=True)
    thread.start()
    return server, thread
