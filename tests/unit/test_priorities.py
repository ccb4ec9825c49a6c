"""Interactive requests go before batch ones: in every engine's waiting queue and in admission."""

from __future__ import annotations

import dataclasses
from collections import deque

from worker.engine import EngineRequest, SamplingParams
from worker.engine.fake import FakeEngine
from worker.engine.scheduler import queue_by_priority

INTERACTIVE, BATCH = 0, 1


def _request(request_id: str, priority: int) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=(1, 2, 3),
        sampling=SamplingParams(),
        max_new_tokens=2,
        eos_token_ids=frozenset(),
        priority=priority,
    )


def test_an_interactive_request_queues_ahead_of_every_batch_request_but_behind_interactive_ones() -> None:
    waiting: deque[EngineRequest] = deque()
    for request_id, priority in (("b1", BATCH), ("i1", INTERACTIVE), ("b2", BATCH), ("i2", INTERACTIVE)):
        queue_by_priority(waiting, _request(request_id, priority))
    assert [request.request_id for request in waiting] == ["i1", "i2", "b1", "b2"]


def test_the_fake_engine_admits_a_later_interactive_request_before_waiting_batch_ones() -> None:
    engine = FakeEngine("abc", max_batch_size=1)
    engine.add(_request("batch-1", BATCH))
    engine.add(_request("batch-2", BATCH))
    engine.add(dataclasses.replace(_request("chat", INTERACTIVE)))
    order: list[str] = []
    while engine.has_unfinished():
        for update in engine.step():
            if update.is_finished:
                order.append(update.request_id)
    assert order == ["chat", "batch-1", "batch-2"]
