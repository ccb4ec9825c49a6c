"""The worker's probe answers through their WSGI route: what a kubelet reads in each phase of a worker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any

from worker.probes import Probes


def _fallback(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"metrics"]


def _get(probes: Probes, path: str, method: str = "GET") -> tuple[str, bytes]:
    status: list[str] = []
    body = b"".join(
        probes.route(_fallback)(
            {"PATH_INFO": path, "REQUEST_METHOD": method}, lambda line, headers: status.append(line)
        )
    )
    return status[0], body


async def _died() -> None:
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


async def test_a_worker_whose_engine_loop_died_fails_liveness_and_readiness() -> None:
    probes = Probes("w-1")
    engine_loop = asyncio.create_task(_died())
    probes.serving(engine_loop)
    assert _get(probes, "/health")[0] == "200 OK"
    await asyncio.gather(engine_loop, return_exceptions=True)
    await asyncio.sleep(0)  # done callbacks run on the loop's next turn
    status, body = _get(probes, "/health")
    assert status == "503 Service Unavailable"
    assert json.loads(body)["error"]["message"] == "Not alive: the engine loop has stopped."
    assert _get(probes, "/ready")[0] == "503 Service Unavailable"


def test_other_paths_reach_the_metrics_exposition_and_head_answers_without_a_body() -> None:
    probes = Probes("w-1")
    assert _get(probes, "/metrics") == ("200 OK", b"metrics")
    assert _get(probes, "/ready", method="HEAD") == ("503 Service Unavailable", b"")
