"""Tools and reasoning through the real worker: a chat job with tools, the fake engine writing a call.

The gateway's side (request fields, rendering) is tested with the routes; here the job
goes straight onto the queue, as the gateway would put it, and the events on the
request's stream are what every gateway renders.
"""

from __future__ import annotations

import json
import time

from redis.asyncio import Redis

from shared.jobs import jobqueue
from shared.protocol import (
    ChatMessage,
    ChatPrompt,
    ChoiceFinished,
    Delta,
    Finished,
    FinishReason,
    FunctionTool,
    GenerationJob,
    SamplingSpec,
    ToolChoice,
)
from tests.helpers import FAKE_MODEL, all_events, running_stack

SCRIPT = (
    "The user asks for the weather; I will call the tool.</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
WEATHER = FunctionTool(
    name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}
)


def weather_job(request_id: str) -> GenerationJob:
    prompt = ChatPrompt(messages=[ChatMessage(role="user", content="Weather in Paris?")], tools=[WEATHER])
    return GenerationJob(
        request_id=request_id,
        model=FAKE_MODEL,
        prompt=prompt,
        sampling=SamplingSpec(temperature=0.0, max_tokens=500),
        created_at=time.time(),
        tool_choice=ToolChoice(mode="auto"),
        n=2,
    )


async def test_a_worker_streams_reasoning_and_tool_calls_and_finishes_with_tool_calls(
    redis_url: str, redis: Redis
) -> None:
    job = weather_job(f"agent-{time.monotonic_ns()}")
    async with running_stack(redis_url, fake_script=SCRIPT, reasoning_parser="deepseek_r1"):
        pool = await jobqueue.open_pool(redis_url)
        try:
            await jobqueue.enqueue(pool, job)
            events = await all_events(redis, job.request_id)
        finally:
            await pool.aclose()

    for index in (0, 1):
        deltas = [e for e in events if isinstance(e, Delta) and e.index == index]
        assert "".join(d.reasoning for d in deltas) == "The user asks for the weather; I will call the tool."
        assert "".join(d.text for d in deltas) == ""
        calls = [call for d in deltas for call in d.tool_calls or []]
        assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == [
            (0, "get_weather", {"city": "Paris"})
        ]
        assert calls[0].id is not None and calls[0].id.startswith("call_")
    ids = {call.id for e in events if isinstance(e, Delta) for call in e.tool_calls or []}
    assert len(ids) == 2  # each choice's call has its own id
    finished = [e.finish_reason for e in events if isinstance(e, ChoiceFinished | Finished)]
    assert finished == [FinishReason.TOOL_CALLS] * 3
