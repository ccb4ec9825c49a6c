"""Chaos run (``make chaos``): 2 gateways, 3 workers, a stream of clients, and processes killed under them.

Everything is real except the model: a private Redis (append-only file on),
``tokenferry gateway`` and ``tokenferry worker --engine fake`` processes on
loopback. Every request is greedy with a fixed length, so its whole text is known
and a stream with duplicated or missing text is detected exactly.

Phases, each printing one JSON line, then a summary table:
1. faults: clients stream without pause while the faults loop SIGKILLs a worker
   (restarting a new one), SIGKILLs a gateway (restarting it; its clients resume
   on the other with Last-Event-ID), and now and then restarts Redis. A worker
   kill counts as recovered when every request it was running ended with the
   exact text; a gateway kill as resumed when every client it was serving did.
2. disconnects: clients open streams and hang up after the first chunk; after
   that, no worker may hold a running sequence (0 busy slots).
3. overload: 10x the cluster's capacity at once; every answer must be 200 or 429.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

from shared import keys, registry
from shared.redis_server import EmbeddedRedis, free_port
from shared.supervisor import Child, Supervisor, cli_command

MODEL = "chaos-model"
STEP_DELAY_S = 0.02
MAX_TOKENS = 120  # ~2.5 s per stream
BATCH = 8
QUEUE_BOUND = 16


@dataclass
class Outcomes:
    sent: int = 0
    completed: int = 0
    failed_clearly: int = 0
    lost: int = 0
    corrupted: int = 0
    resumed_streams: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    by_request: dict[str, bool] = field(default_factory=dict)  # request id -> exact text


class Cluster:
    """Two gateways and three workers over one Redis; every process restartable."""

    def __init__(self, log_dir: Path) -> None:
        self.redis = EmbeddedRedis(append_only=True)
        self._log_dir = log_dir
        self._supervisor = Supervisor(grace_s=20)
        self.gateway_ports = [free_port(), free_port()]
        self.gateways: list[Child | None] = [None, None]
        self.workers: dict[str, Child] = {}
        self._serial = 0

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.gateway_ports]

    def start(self) -> None:
        self.redis.start()
        for index in range(2):
            self.start_gateway(index)
        for _ in range(3):
            self.start_worker()

    def start_gateway(self, index: int) -> None:
        flags = ["--port", str(self.gateway_ports[index]), "--max-queued-requests", str(QUEUE_BOUND)]
        self.gateways[index] = self._spawn(f"gateway{index}", "gateway", *flags)

    def start_worker(self) -> str:
        self._serial += 1
        worker_id = f"chaos-w{self._serial}"
        flags = [
            "--engine",
            "fake",
            "--model",
            MODEL,
            "--worker-id",
            worker_id,
            "--max-batch-size",
            str(BATCH),
        ]
        self.workers[worker_id] = self._spawn(worker_id, "worker", *flags)
        return worker_id

    def kill_worker(self, worker_id: str) -> None:
        process = self.workers.pop(worker_id)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def kill_gateway(self, index: int) -> None:
        process = self.gateways[index]
        if process is not None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        self._supervisor.stop()
        self.redis.stop()

    def _spawn(self, name: str, *argv: str) -> Child:
        env = {
            **os.environ,
            "TOKENFERRY_FAKE_STEP_DELAY_S": str(STEP_DELAY_S),
            "TOKENFERRY_LOG_LEVEL": "WARNING",
        }
        command = cli_command(*argv, "--redis-url", self.redis.url)
        # Appended to: a restarted process's log follows its predecessor's.
        return self._supervisor.start(name, command, env=env, output=self._log_dir / f"{name}.log")


def _body(stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "chaos"}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": stream,
    }


class StreamClient:
    """One client: streams a request, resumes on the other gateway when its gateway dies."""

    def __init__(self, cluster: Cluster, expected: str, outcomes: Outcomes) -> None:
        self._cluster = cluster
        self._expected = expected
        self._outcomes = outcomes

    async def run_one(self, client: httpx.AsyncClient) -> None:
        self._outcomes.sent += 1
        gateway = random.randrange(2)
        try:
            text, request_id = await asyncio.wait_for(self._stream(client, gateway), timeout=120)
        except TimeoutError:
            self._outcomes.lost += 1
            return
        except _ClearFailure as failure:
            self._outcomes.failed_clearly += 1
            self._outcomes.failures[str(failure)] += 1
            return
        exact = text == self._expected
        self._outcomes.by_request[request_id] = exact
        if exact:
            self._outcomes.completed += 1
        else:
            self._outcomes.corrupted += 1

    async def _stream(self, client: httpx.AsyncClient, gateway: int) -> tuple[str, str]:
        urls = self._cluster.urls()
        text, last_id, request_id = "", None, ""
        reasons: list[str] = []
        for attempt in range(12):
            url = urls[(gateway + attempt) % 2]
            try:
                if not request_id:
                    request = client.build_request("POST", f"{url}/v1/chat/completions", json=_body())
                else:
                    headers: dict[str, str] = {"Last-Event-ID": last_id} if last_id else {}
                    request = client.build_request(
                        "GET", f"{url}/v1/requests/{request_id}/stream", headers=headers
                    )
                    self._outcomes.resumed_streams += 1
                response = await client.send(request, stream=True)
                try:
                    if response.status_code != 200:
                        body = (await response.aread()).decode(errors="replace")
                        if response.status_code in (429, 503):  # overloaded or Redis restarting: retry
                            reasons.append(str(response.status_code))
                            await asyncio.sleep(0.5)
                            continue
                        raise _ClearFailure(f"{response.status_code} {body[:80]}")
                    request_id = request_id or response.headers.get("x-request-id", "")
                    text, last_id, done = await _read_events(response, text, last_id)
                    if done:
                        return text, request_id
                finally:
                    await response.aclose()
            except httpx.HTTPError as error:
                reasons.append(type(error).__name__)
                await asyncio.sleep(0.3)  # the gateway died: resume on the other one
            else:
                reasons.append("ended early")
        raise _ClearFailure(f"gave up after 12 connection attempts: {reasons[-4:]}")


class _ClearFailure(Exception):
    pass


async def _read_events(
    response: httpx.Response, text: str, last_id: str | None
) -> tuple[str, str | None, bool]:
    """Consume SSE events, committing text only up to each ``id:`` (what a resume restarts after)."""
    pending, event_id, data = "", None, []
    async for line in response.aiter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            payload = "\n".join(data)
            data = []
            if payload == "[DONE]":
                return text + pending, last_id, True
            chunk = json.loads(payload)
            if "error" in chunk:
                raise _ClearFailure(f"in-band {chunk['error'].get('code')}")
            for choice in chunk.get("choices", []):
                pending += choice.get("delta", {}).get("content") or ""
            if event_id is not None:
                text, pending, last_id, event_id = text + pending, "", event_id, None
    return text, last_id, False


async def _expected_text(cluster: Cluster) -> str:
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{cluster.urls()[0]}/v1/chat/completions", json=_body(stream=False))
        response.raise_for_status()
        return str(response.json()["choices"][0]["message"]["content"])


async def _wait_ready(cluster: Cluster, workers: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    async with Redis.from_url(cluster.redis.url) as redis, httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < deadline:
            try:
                live = [w for w in await registry.live_workers(redis) if w.model == MODEL]
                answers = [await client.get(f"{url}/health") for url in cluster.urls()]
                if len(live) >= workers and all(answer.status_code == 200 for answer in answers):
                    return
            except (httpx.HTTPError, OSError):
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError("the chaos cluster did not become ready")


async def _running_requests(redis: Redis, worker_id: str) -> list[str]:
    members = await redis.smembers(keys.running(MODEL))  # type: ignore[misc]
    owned = []
    for member in members:
        request_id = member.decode()
        owner = await redis.hget(keys.run(request_id), "owner")  # type: ignore[misc]
        if owner and owner.decode().startswith(f"{worker_id}/"):
            owned.append(request_id)
    return owned


@dataclass
class FaultLog:
    worker_kills: list[list[str]] = field(default_factory=list)  # request ids running on each victim
    gateway_kills: int = 0
    redis_restarts: int = 0


async def _faults(cluster: Cluster, log: FaultLog, rounds: int, redis_every: int) -> None:
    async with Redis.from_url(cluster.redis.url) as redis:
        for round_ in range(rounds):
            await asyncio.sleep(1.5)
            # The busiest worker: a kill that hits no running request proves nothing.
            running = {worker: await _running_requests(redis, worker) for worker in sorted(cluster.workers)}
            victim = max(running, key=lambda worker: len(running[worker]))
            log.worker_kills.append(running[victim])
            cluster.kill_worker(victim)
            cluster.start_worker()
            await asyncio.sleep(1.5)
            index = random.randrange(2)
            cluster.kill_gateway(index)
            log.gateway_kills += 1
            await asyncio.sleep(0.5)
            cluster.start_gateway(index)
            if redis_every and (round_ + 1) % redis_every == 0:
                await asyncio.to_thread(cluster.redis.restart)
                log.redis_restarts += 1


async def phase_faults(cluster: Cluster, rounds: int, clients: int, redis_every: int) -> dict[str, Any]:
    expected = await _expected_text(cluster)
    outcomes = Outcomes()
    log = FaultLog()
    stop = asyncio.Event()
    client_of = StreamClient(cluster, expected, outcomes)

    async def client_loop(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            await client_of.run_one(http)

    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=60)) as http:
        loops = [asyncio.create_task(client_loop(http)) for _ in range(clients)]
        await _faults(cluster, log, rounds, redis_every)
        stop.set()
        await asyncio.gather(*loops)
    # Jobs whose POST died with its gateway before the client saw an id are nobody's: the client
    # retried as a new request. A kill is recovered when every request a client knew ended exactly.
    orphans = {rid for ids in log.worker_kills for rid in ids if rid not in outcomes.by_request}
    affected = [ids for ids in log.worker_kills if ids]
    recovered = sum(all(outcomes.by_request.get(rid, True) for rid in ids) for ids in affected)
    return {
        "phase": "faults",
        "requests_sent": outcomes.sent,
        "completed": outcomes.completed,
        "failed_with_clear_error": outcomes.failed_clearly,
        "lost": outcomes.lost,
        "duplicated_or_missing_text": outcomes.corrupted,
        "failure_kinds": dict(outcomes.failures),
        "worker_kills": len(log.worker_kills),
        "worker_kills_with_running_requests": len(affected),
        "worker_kills_recovered": recovered,
        "killed_jobs_no_client_knew": len(orphans),
        "gateway_kills": log.gateway_kills,
        "resumed_streams": outcomes.resumed_streams,
        "redis_restarts": log.redis_restarts,
    }


async def phase_disconnects(cluster: Cluster, count: int, concurrency: int) -> dict[str, Any]:
    semaphore = asyncio.Semaphore(concurrency)
    errors = Counter[str]()

    async def hang_up(http: httpx.AsyncClient, index: int) -> None:
        async with semaphore:
            url = cluster.urls()[index % 2]
            try:
                async with http.stream("POST", f"{url}/v1/chat/completions", json=_body()) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data:"):
                            break  # the first chunk: hang up
            except httpx.HTTPError as error:
                errors[type(error).__name__] += 1

    async with httpx.AsyncClient(timeout=60) as http:
        await asyncio.gather(*(hang_up(http, index) for index in range(count)))
    busy = -1
    async with Redis.from_url(cluster.redis.url) as redis:
        for _ in range(40):  # a few steps after the last hang-up, nothing may still run
            await asyncio.sleep(0.25)
            busy = int(await redis.scard(keys.running(MODEL)))
            if busy == 0:
                break
    return {
        "phase": "disconnects",
        "client_disconnects": count,
        "busy_slots_after": busy,
        "errors": dict(errors),
    }


async def phase_overload(cluster: Cluster, factor: int) -> dict[str, Any]:
    capacity = len(cluster.workers) * BATCH + QUEUE_BOUND
    statuses = Counter[str]()

    async def one(http: httpx.AsyncClient, index: int) -> None:
        url = cluster.urls()[index % 2]
        try:
            response = await http.post(f"{url}/v1/chat/completions", json=_body(stream=False))
            statuses[str(response.status_code)] += 1
        except httpx.TimeoutException:
            statuses["timeout"] += 1
        except httpx.HTTPError as error:
            statuses[type(error).__name__] += 1

    limits = httpx.Limits(max_connections=factor * capacity)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(one(http, index) for index in range(factor * capacity)))
    clean = set(statuses) <= {"200", "429"}
    return {
        "phase": "overload",
        "requests": factor * capacity,
        "statuses": dict(statuses),
        "only_200_and_429": clean,
    }


async def run(args: argparse.Namespace) -> int:
    log_dir = Path(tempfile.mkdtemp(prefix="tokenferry-chaos-"))
    cluster = Cluster(log_dir)
    results: list[dict[str, Any]] = []
    try:
        cluster.start()
        await _wait_ready(cluster, workers=3)
        results.append(await phase_faults(cluster, args.rounds, args.clients, args.redis_every))
        print(json.dumps(results[-1]), flush=True)
        await _wait_ready(cluster, workers=3)
        results.append(await phase_disconnects(cluster, args.disconnects, concurrency=24))
        print(json.dumps(results[-1]), flush=True)
        results.append(await phase_overload(cluster, factor=10))
        print(json.dumps(results[-1]), flush=True)
    finally:
        cluster.stop()
    _print_summary(results, log_dir)
    faults, disconnects, overload = results
    ok = (
        faults["lost"] == 0
        and faults["duplicated_or_missing_text"] == 0
        and faults["worker_kills_recovered"] == faults["worker_kills_with_running_requests"]
        and disconnects["busy_slots_after"] == 0
        and overload["only_200_and_429"]
    )
    return 0 if ok else 1


def _print_summary(results: list[dict[str, Any]], log_dir: Path) -> None:
    faults = results[0]
    print("\nchaos summary")
    for name in (
        "requests_sent", "completed", "failed_with_clear_error", "lost", "duplicated_or_missing_text",
        "worker_kills", "worker_kills_with_running_requests", "worker_kills_recovered",
        "gateway_kills", "resumed_streams", "redis_restarts",
    ):  # fmt: skip
        print(f"  {name:36} {faults[name]}")
    if len(results) > 1:
        print(f"  {'client_disconnects':36} {results[1]['client_disconnects']}")
        print(f"  {'busy_slots_after_disconnects':36} {results[1]['busy_slots_after']}")
    if len(results) > 2:
        print(f"  {'overload_requests':36} {results[2]['requests']}")
        print(f"  {'overload_statuses':36} {results[2]['statuses']}")
    print(f"  logs in {log_dir}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="worker kills (and as many gateway kills)")
    parser.add_argument("--clients", type=int, default=12, help="concurrent streaming clients")
    parser.add_argument("--redis-every", type=int, default=7, help="restart Redis every N rounds (0: never)")
    parser.add_argument("--disconnects", type=int, default=1000)
    sys.exit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
