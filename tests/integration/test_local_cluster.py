"""``make cluster``'s topology for real on loopback: Redis (AOF), nginx, 2 gateways, 2 fake-engine workers.

One cluster per module (starting it takes a few seconds on 2 cores); the last test
stops it and checks that nothing it started is left running.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import psutil
import pytest
import redis

from deploy.cluster.main import READY_LINE
from shared import keys
from shared.redis_server import free_port
from shared.settings import WorkerSettings
from shared.supervisor import Child, ChildExited, NotReady, wait_until
from tests.deployment import ROOT

START_TIMEOUT_S = 120.0
STEP_DELAY_S = 0.05  # per fake token: slow enough to see whether tokens arrive one by one
SCRIPT = WorkerSettings.model_fields["fake_script"].default


@dataclass
class Cluster:
    process: Child
    log: Path
    base_url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def redis_url(self) -> str:
        found = re.search(r"Redis \(AOF on\) at (redis://\S+)", self.output())
        assert found, self.output()
        return found.group(1)


def _wait_ready(cluster: Cluster) -> None:
    try:
        wait_until(
            lambda: READY_LINE in cluster.output(),
            [cluster.process],
            timeout_s=START_TIMEOUT_S,
            what="the cluster",
            interval_s=0.2,
        )
    except ChildExited:
        pytest.fail(f"the cluster exited with {cluster.process.returncode}:\n{cluster.output()[-4000:]}")
    except NotReady:
        pytest.fail(f"the cluster was not ready within {START_TIMEOUT_S} s:\n{cluster.output()[-4000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    port = free_port()
    log = tmp_path_factory.mktemp("cluster") / "cluster.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENFERRY_FAKE_STEP_DELAY_S": str(STEP_DELAY_S)}
    argv = ["--engine", "fake", "--port", str(port), "--ready-timeout", "90", "--stop-timeout", "20"]
    command = [sys.executable, "-m", "deploy.cluster", *argv]
    process = Child("cluster", command, cwd=ROOT, env=env, output=log, own_session=False)
    started = Cluster(process, log, f"http://127.0.0.1:{port}/v1")
    try:
        _wait_ready(started)
        yield started
    finally:
        if process.poll() is None:
            process.kill()  # only reached when a test failed before the stop test ran
            process.wait()


def _members(cluster: Cluster) -> list[psutil.Process]:
    return psutil.Process(cluster.process.pid).children(recursive=True)


def test_cluster_runs_the_deployment_topology(cluster: Cluster) -> None:
    commands = [" ".join(member.cmdline()) for member in _members(cluster)]
    roles = {
        role: sum(1 for command in commands if re.search(pattern, command))
        for role, pattern in {
            "redis": r"(redis|valkey)-server",  # PATH's or a wheel's: see shared/redis_server.py
            "gateway": "cli gateway",
            "worker": "cli worker",
            "nginx": "nginx: master",
        }.items()
    }
    assert roles == {"redis": 1, "gateway": 2, "worker": 2, "nginx": 1}, commands
    client = redis.Redis.from_url(cluster.redis_url())
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert len(client.smembers(keys.workers_index())) == 2
    finally:
        client.close()


def test_chat_streams_through_nginx_token_by_token(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=30)
    model = client.models.list().data[0].id
    started = time.monotonic()
    arrivals: list[tuple[float, str]] = []
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hello through nginx"}],
        stream=True,
        max_tokens=24,
        temperature=0,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append((time.monotonic() - started, chunk.choices[0].delta.content))
    assert "".join(text for _, text in arrivals) == SCRIPT[:24]
    # Token by token: the first chunk arrives while the worker still has most of its
    # 24 steps to go, not all of them together at the end.
    first, last = arrivals[0][0], arrivals[-1][0]
    assert last - first >= 0.5 * 23 * STEP_DELAY_S, arrivals


def test_stopping_the_cluster_leaves_no_process_behind(cluster: Cluster) -> None:
    members = _members(cluster)
    assert len(members) >= 6
    cluster.process.send_signal(signal.SIGTERM)
    assert cluster.process.wait(timeout=60) == 0, cluster.output()[-4000:]
    _, alive = psutil.wait_procs(members, timeout=5)
    assert alive == [], [process.cmdline() for process in alive]
    assert "tokenferry cluster: stopped" in cluster.output()


def test_a_process_dying_at_start_up_stops_the_whole_cluster(tmp_path: Path) -> None:
    marker = f"cluster-test-{uuid.uuid4().hex}"
    env = {**os.environ, "TOKENFERRY_CLUSTER_TEST_MARKER": marker}
    # /bin/false stands in for an nginx that refuses its config.
    argv = ["--engine", "fake", "--port", str(free_port()), "--nginx", "/bin/false", "--stop-timeout", "20"]
    result = subprocess.run(
        [sys.executable, "-m", "deploy.cluster", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert result.returncode == 1
    assert "nginx exited with code 1 during start-up" in result.stderr
    leftovers = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("TOKENFERRY_CLUSTER_TEST_MARKER") == marker:
                leftovers.append(process.cmdline())
    assert leftovers == []
