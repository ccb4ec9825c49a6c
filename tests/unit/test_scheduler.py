"""Admission and prefill planning, as pure bookkeeping."""

from __future__ import annotations

from dataclasses import replace

from tests.engines import request
from worker.engine.scheduler import BatchLimits, PrefillChunk, Scheduler, group_by_length


def test_admission_is_fifo_and_never_skips_the_head() -> None:
    scheduler = Scheduler(BatchLimits(max_batch_size=8, max_batch_tokens=40))
    scheduler.add(request("big", list(range(24)), max_new_tokens=20))  # holds 25 at its first decode
    scheduler.add(request("small", [1], max_new_tokens=1))
    assert [r.request_id for r in scheduler.admit([10])] == []  # 2 x 25 > 40: the head waits, so does small
    assert [r.request_id for r in scheduler.admit([])] == ["big"]


def test_admission_counts_what_sequences_hold_not_their_final_length() -> None:
    scheduler = Scheduler(BatchLimits(max_batch_size=8, max_batch_tokens=40))
    for rid in "abc":  # each may reach 4 + 1000 positions, but holds 5 at its first decode
        scheduler.add(request(rid, [1, 2, 3, 4], max_new_tokens=1000))
    assert [r.request_id for r in scheduler.admit([8])] == ["a", "b", "c"]  # 4 rows x 8 <= 40


def test_a_resumption_goes_first_among_its_priority() -> None:
    scheduler = Scheduler(BatchLimits())
    scheduler.add(replace(request("urgent", [1]), priority=0))
    scheduler.add(replace(request("later", [1]), priority=1))
    scheduler.resume(replace(request("preempted", [1, 2, 3]), priority=1))
    assert [r.request_id for r in scheduler.waiting] == ["urgent", "preempted", "later"]


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
    # What a prefill turn has left after its first forwards, not a whole budget.
    assert scheduler.plan_prefill([("long", 20, 25), ("short", 0, 4)], budget=7) == [
        PrefillChunk("long", 20, 25, 25),
        PrefillChunk("short", 0, 2, 4),
    ]


def test_prompts_finishing_prefill_are_grouped_where_a_forward_costs_less_than_the_padding_it_saves() -> None:
    assert group_by_length([], overhead=32) == []
    assert group_by_length([40] * 5, overhead=32) == [[0, 1, 2, 3, 4]]
    # 18 remainders of 16 beside one of 36: two forwards (18 x 16 + 36 + 2 x 32) beat one (19 x 36 + 32).
    assert group_by_length([16] * 9 + [36] + [16] * 9, overhead=32) == [[*range(9), *range(10, 19)], [9]]
    # Close lengths stay together, shortest first.
    assert group_by_length([12, 10, 11], overhead=32) == [[1, 2, 0]]
    assert group_by_length([3, 100], overhead=0) == [[0], [1]]
    assert group_by_length([3, 100], overhead=1000) == [[0, 1]]
