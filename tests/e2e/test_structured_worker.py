"""A real worker enforces a job's constraint: the job's stream carries JSON that validates, or a 400.

The worker runs in this process on the real model and its own Redis, fed jobs straight
through the queue, as a gateway would submit them: the wiring from the worker's start-up
(grammar compiler, warm-up) through preparation to the engine, without a gateway.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import jsonschema
import pytest

from shared.jobs import jobqueue
from shared.protocol import (
    Accepted,
    ChatMessage,
    ChatPrompt,
    Constraint,
    Delta,
    Failed,
    Finished,
    FinishReason,
    GenerationJob,
    GrammarConstraint,
    JsonConstraint,
    SamplingSpec,
)
from shared.redis_server import EmbeddedRedis
from shared.settings import WorkerSettings
from tests.helpers import all_events, in_background
from worker.main import build_worker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
async def worker_model(redis_url: str) -> AsyncIterator[str]:
    model = f"structured-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings(redis_url=redis_url, served_model_name=[model], poll_delay_s=0.01)
    worker = build_worker(settings, handle_signals=False)
    try:
        async with in_background(worker.async_run()):
            yield model
    finally:
        await worker.close()


def chat_job(model: str, constraint: Constraint) -> GenerationJob:
    question = "Name a large city and its population, as JSON."
    return GenerationJob(
        request_id=f"structured-{uuid.uuid4().hex}",
        model=model,
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content=question)]),
        sampling=SamplingSpec(max_tokens=80),
        created_at=time.time(),
        constraint=constraint,
    )


async def test_a_json_schema_job_streams_json_that_validates_and_a_bad_grammar_is_refused_first(
    redis_url: str, worker_model: str
) -> None:
    pool = await jobqueue.open_pool(redis_url)
    try:
        good = chat_job(worker_model, JsonConstraint(json_schema=SCHEMA))
        bad = chat_job(worker_model, GrammarConstraint(grammar="start: item\nitem: missing_rule"))
        await jobqueue.enqueue(pool, good)
        await jobqueue.enqueue(pool, bad)
        good_events = await all_events(pool, good.request_id, timeout_s=300)
        bad_events = await all_events(pool, bad.request_id, timeout_s=300)
    finally:
        await pool.aclose()
    assert isinstance(good_events[0], Accepted)
    finished = good_events[-1]
    assert isinstance(finished, Finished) and finished.finish_reason is FinishReason.STOP
    text = "".join(event.text for event in good_events if isinstance(event, Delta))
    jsonschema.validate(json.loads(text), SCHEMA)
    (refused,) = bad_events
    assert isinstance(refused, Failed)
    assert (refused.error.type, refused.error.param) == (
        "invalid_request_error",
        "structured_outputs.grammar",
    )
