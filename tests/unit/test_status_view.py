"""`tokenferry status` rendering: a snapshot of workers and queues as aligned text."""

from __future__ import annotations

from cli.status import redact, render
from shared.cluster import ClusterSnapshot, QueueDepth
from shared.keys import Lane
from shared.registry import WorkerInfo, WorkerLoad

NOW = 1_700_000_000.0


def _worker(worker_id: str, model: str, load: WorkerLoad | None) -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id,
        model=model,
        max_model_len=4096,
        started_at=NOW - 60,
        heartbeat_at=NOW - 1.5,
        load=load,
    )


def test_workers_and_queues_are_shown_with_load_and_heartbeat_age() -> None:
    snapshot = ClusterSnapshot(
        taken_at=NOW,
        workers=[
            _worker("gpu-a", "llama", WorkerLoad(running=12, waiting=3, generation_tokens_per_s=420.5)),
            _worker("old-b", "llama", None),
        ],
        queues=[
            QueueDepth(model="llama", lane=Lane.INTERACTIVE, jobs=15),
            QueueDepth(model="llama", lane=Lane.BATCH, jobs=0),
        ],
    )
    screen = render(snapshot, "redis://cache:6379/0").splitlines()
    assert screen[0].startswith("tokenferry status  ") and screen[0].endswith("redis://cache:6379/0")
    assert screen[2] == "WORKERS: 2 live, 420.5 tok/s generated"
    assert screen[3].split() == ["WORKER", "MODEL", "HEARTBEAT", "RUNNING", "WAITING", "TOK/S"]
    assert screen[4].split() == ["gpu-a", "llama", "1.5s", "ago", "12", "3", "420.5"]
    assert screen[5].split() == ["old-b", "llama", "1.5s", "ago", "-", "-", "-"]
    # Numbers are right-aligned under their heading.
    assert screen[4].index("12") + 2 == screen[3].index("RUNNING") + len("RUNNING")
    assert screen[8].split() == ["MODEL", "LANE", "JOBS"]
    assert screen[9].split() == ["llama", "interactive", "15"]
    assert screen[10].split() == ["llama", "batch", "0"]


def test_an_empty_cluster_says_so() -> None:
    screen = render(ClusterSnapshot(taken_at=NOW, workers=[], queues=[]), "redis://x")
    assert "WORKERS: 0 live, 0.0 tok/s generated\n  (none)" in screen
    assert "(no model served yet)" in screen


def test_passwords_never_reach_the_screen() -> None:
    assert redact("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert redact("rediss://user:s3cret@cache:6380") == "rediss://user:***@cache:6380"
    assert redact("redis://cache:6379") == "redis://cache:6379"
