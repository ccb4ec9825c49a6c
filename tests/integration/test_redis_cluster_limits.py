"""Why model groups and not Redis Cluster (``docs/deployment.md``, "Past one Redis"), kept true.

A local three-primary cluster (``--cluster-enabled yes``) refuses the queue's keys as
they are: the enqueue script's keys fall in several slots, and arq's finish transaction
joins every job's keys to the one fixed ``arq:abort``. A ``{model}`` hash tag would fix
the first and not the second; redis-py's cluster client refuses transactions at all.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from shared import keys
from shared.jobs.jobqueue import _ENQUEUE  # the script itself: a cluster client is no QueuePool
from shared.redis_server import RedisServerError, find_redis_binary, free_port
from shared.supervisor import Child, wait_until
from tests.processes import stop_all

SLOTS = 16384
JOB = "req-1"


def _each(ports: list[int], check: str) -> bool:
    """Whether every node passes ``check``: "ping", or "ok" (its cluster state)."""
    try:
        for port in ports:
            with redis.Redis(port=port, socket_timeout=1) as node:
                if not (node.ping() if check == "ping" else node.cluster("info")["cluster_state"] == "ok"):
                    return False
    except RedisError:
        return False
    return True


@pytest.fixture
async def cluster() -> AsyncIterator[RedisCluster]:
    try:
        binary = find_redis_binary()
    except RedisServerError as error:
        pytest.fail(str(error))
    # Each node's bus port is its own free port, not port + 10000 (which may be taken or past 65535).
    ports, buses = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    with tempfile.TemporaryDirectory(prefix="tokenferry-cluster-") as workdir:
        nodes = [_node(binary, Path(workdir), port, bus) for port, bus in zip(ports, buses, strict=True)]
        try:
            wait_until(
                lambda: _each(ports, "ping"), nodes, timeout_s=10, what="cluster nodes", interval_s=0.05
            )
            _form(ports, buses[0])
            wait_until(lambda: _each(ports, "ok"), nodes, timeout_s=20, what="cluster ok", interval_s=0.1)
            client = RedisCluster(host="127.0.0.1", port=ports[0])
            try:
                yield client
            finally:
                await client.aclose()
        finally:
            stop_all(nodes, timeout_s=5)


def _node(binary: Path, workdir: Path, port: int, bus: int) -> Child:
    command = [
        str(binary), "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
        "--cluster-port", str(bus),
        "--cluster-config-file", str(workdir / f"nodes-{port}.conf"), "--dir", str(workdir),
        "--save", "", "--appendonly", "no",
    ]  # fmt: skip
    return Child(f"node-{port}", command, output=subprocess.DEVNULL, own_session=False)


def _form(ports: list[int], first_bus: int) -> None:
    """Give each node a third of the slots and introduce them to each other."""
    step = SLOTS // len(ports)
    for index, port in enumerate(ports):
        last = SLOTS - 1 if index == len(ports) - 1 else (index + 1) * step - 1
        with redis.Redis(port=port) as node:
            node.execute_command("CLUSTER", "ADDSLOTSRANGE", index * step, last)
            if index:
                node.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[0], first_bus)


def _enqueue_keys(job_id: str, model: str) -> list[str]:
    return [
        keys.ARQ_JOB_PREFIX + job_id,
        keys.ARQ_RESULT_PREFIX + job_id,
        keys.queue(model),
        keys.running(model),
    ]


async def test_the_enqueue_script_needs_every_key_in_one_slot(cluster: RedisCluster) -> None:
    arguments = ["{}", "1000", "1", JOB, "", "interactive"]
    with pytest.raises(RedisClusterException, match="same key slot"):
        await cluster.eval(_ENQUEUE, 4, *_enqueue_keys(JOB, "m"), *arguments)
    # With the model as a hash tag in the job id and the queue names, the same script runs.
    tagged = "{m}" + JOB
    reply = await cluster.eval(
        _ENQUEUE, 4, *_enqueue_keys(tagged, "{m}"), *arguments[:3], tagged, *arguments[4:]
    )
    assert reply[0] == 1


async def test_arqs_fixed_abort_set_cannot_share_a_slot_with_hash_tagged_jobs(cluster: RedisCluster) -> None:
    # arq's finish_job: ZREM arq:abort, ZREM the queue, DEL the job's keys, in one MULTI.
    finish = (
        "redis.call('ZREM', KEYS[1], ARGV[1]); redis.call('ZREM', KEYS[2], ARGV[1]);"
        " return redis.call('DEL', KEYS[3])"
    )
    tagged = "{m}" + JOB
    with pytest.raises(RedisClusterException, match="same key slot"):
        await cluster.eval(
            finish, 3, keys.ARQ_ABORTS, keys.queue("{m}"), keys.ARQ_JOB_PREFIX + tagged, tagged
        )
    with pytest.raises(RedisClusterException, match="transaction"):
        cluster.pipeline(transaction=True)  # arq's MULTI/WATCH has no cluster client to run on
