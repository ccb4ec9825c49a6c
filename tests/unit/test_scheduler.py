"""Admission and prefill planning, as pure bookkeeping."""

from __future__ import annotations

from tests.engines import request
from worker.engine.scheduler import BatchLimits, PrefillChunk, Scheduler


def test_admission_is_fifo_and_never_skips_the_head() -> None:
    scheduler = Scheduler(BatchLimits(max_batch_size=8, max_batch_tokens=40))
    scheduler.add(request("big", list(range(10)), max_new_tokens=20))  # final length 30
    scheduler.add(request("small", [1], max_new_tokens=1))
    assert [r.request_id for r in scheduler.admit([10])] == []  # 2 x 30 > 40: the head waits, so does small
    assert [r.request_id for r in scheduler.admit([])] == ["big"]


def test_batch_size_caps_admission() -> None:
    scheduler = Scheduler(BatchLimits(max_batch_size=2))
    for rid in "abc":
        scheduler.add(request(rid, [1]))
    assert [r.request_id for r in scheduler.admit([])] == ["a", "b"]


def test_prefill_is_chunked_by_the_step_budget_oldest_first() -> None:
    scheduler = Scheduler(BatchLimits(max_prefill_tokens=10))
    chunks = scheduler.plan_prefill([("long", 0, 25), ("short", 0, 4)])
    assert chunks == [PrefillChunk("long", 0, 10, 25)]
    chunks = scheduler.plan_prefill([("long", 20, 25), ("short", 0, 4)])
    assert chunks == [PrefillChunk("long", 20, 25, 25), PrefillChunk("short", 0, 4, 4)]
    assert chunks[0].is_last and chunks[1].is_last
