"""vLLM's engine takes adds and aborts while a step is in flight (``concurrent_admission``): the
driver hands them over at once instead of after the step (``worker/driver/admission.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.engines import request
from worker.engine import Engine, SequenceUpdate

EngineFactory = Callable[[], Engine]
STEP_WAIT_S = 120.0  # a step of vLLM's on 2 busy cores, with margin
# A prefill that keeps vLLM's core busy well past an add (ids unlike any other test's: no prefix hits).
LONG_PROMPT = tuple(range(2000, 3500))


@pytest.fixture(scope="module")
def make_engine() -> Iterator[EngineFactory]:
    from tests.vllm_engine import shared_vllm_engine

    with shared_vllm_engine(vllm_multiprocessing=True) as make:  # the core in a child: a step waits for it
        yield make


def _concurrent_engine(make_engine: EngineFactory) -> Engine:
    engine = make_engine()
    assert getattr(engine, "concurrent_admission", False)
    return engine


def _step_in_flight(engine: Engine, stepper: ThreadPoolExecutor) -> Future[list[SequenceUpdate]]:
    """Start ``engine.step()`` on ``stepper``; returns once the step has begun."""
    began = threading.Event()

    def step() -> list[SequenceUpdate]:
        began.set()
        return engine.step()

    in_flight = stepper.submit(step)
    assert began.wait(STEP_WAIT_S)
    return in_flight


def test_an_add_beside_a_step_in_flight_is_stepped_right_after_it(make_engine: EngineFactory) -> None:
    engine = _concurrent_engine(make_engine)
    engine.add(request("long", LONG_PROMPT, max_new_tokens=3))
    with ThreadPoolExecutor(max_workers=1) as stepper:
        in_flight = _step_in_flight(engine, stepper)
        engine.add(request("short", [5, 6], max_new_tokens=3))
        added_in_flight = not in_flight.done()  # the add did not wait for the step
        steps = [in_flight.result(STEP_WAIT_S)]
        if not any(update.request_id == "short" for update in steps[0]):
            steps.append(stepper.submit(engine.step).result(STEP_WAIT_S))
    assert added_in_flight
    # The core had it while it prefilled "long": its first token comes in that step or the next.
    assert any(update.request_id == "short" and update.new_token_ids for update in steps[-1])
    while engine.has_unfinished():
        engine.step()


def test_aborting_the_only_request_ends_a_step_in_flight(make_engine: EngineFactory) -> None:
    engine = _concurrent_engine(make_engine)
    engine.add(request("alone", LONG_PROMPT[::-1], max_new_tokens=50))
    with ThreadPoolExecutor(max_workers=1) as stepper:
        in_flight = _step_in_flight(engine, stepper)
        engine.abort("alone")
        updates = in_flight.result(STEP_WAIT_S)  # not a wait for outputs that never come
    assert all(update.request_id != "alone" or not update.is_finished for update in updates)
    assert not engine.has_unfinished()
