"""Helpers for tests that run real tokenferry processes: wait until a model is served, stop them all."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_for_model(
    base_url: str, processes: list[subprocess.Popen[bytes]], model: str, timeout_s: float
) -> None:
    """Block until ``model`` is listed by the gateway; fail if a process exits first.

    Other tests' workers may share the session's Redis, so the model is awaited by name.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = [process for process in processes if process.poll() is not None]
        if exited:
            output = exited[0].stdout.read().decode() if exited[0].stdout else "(see its log)"
            raise AssertionError(f"a process exited during start-up: {output}")
        try:
            served = httpx.get(f"{base_url}/v1/models", timeout=5).json()["data"]
            if any(entry["id"] == model for entry in served):
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{model} was not served within {timeout_s} s")


def stop_all(processes: list[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
