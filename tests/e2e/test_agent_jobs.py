"""Agent jobs on the real SmolLM2 worker: tools and tool results rendered with the Hermes fallback.

The bundled model's template knows no tools, so the worker writes them into the chat
(``worker/requests/tool_fallback.py``). The jobs go straight onto the queue, as the
gateway puts them, and the request's events are read back from Redis.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from shared.jobs import jobqueue
from shared.jobs.streams import EventReader
from shared.protocol import (
    Accepted,
    ChatMessage,
    ChatPrompt,
    ChoiceFinished,
    Delta,
    FunctionTool,
    GenerationJob,
    SamplingSpec,
    TokenEvent,
    ToolCall,
    ToolChoice,
)
from shared.redis_server import EmbeddedRedis
from shared.settings import BUNDLED_MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WEATHER = FunctionTool(
    name="get_weather",
    description="Current weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
HISTORY = [
    ChatMessage(role="user", content="What is the weather in Paris?"),
    ChatMessage(
        role="assistant",
        content=None,
        tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')],
    ),
    ChatMessage(role="tool", content="18 degrees and sunny", tool_call_id="call_1"),
]


async def run_job(redis_url: str, job: GenerationJob) -> list[TokenEvent]:
    pool = await jobqueue.open_pool(redis_url)
    try:
        await jobqueue.enqueue(pool, job)
        deadline = time.monotonic() + 600
        return [item.event async for item in EventReader(pool).read(job.request_id, deadline=deadline)]
    finally:
        await pool.aclose()


def test_a_tool_result_conversation_renders_and_the_model_answers_from_it(
    gateway_url: str, e2e_redis: EmbeddedRedis
) -> None:
    job = GenerationJob(
        request_id=f"agent-e2e-{time.monotonic_ns()}",
        model=BUNDLED_MODEL,
        prompt=ChatPrompt(messages=HISTORY, tools=[WEATHER]),
        sampling=SamplingSpec(temperature=0.0, max_tokens=40),
        created_at=time.time(),
        echo=True,
        tool_choice=ToolChoice(mode="auto"),
    )

    events = asyncio.run(run_job(e2e_redis.url, job))

    accepted = events[0]
    assert isinstance(accepted, Accepted) and accepted.prompt_text is not None
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in accepted.prompt_text
    )
    assert "<tool_response>\n18 degrees and sunny\n</tool_response>" in accepted.prompt_text
    assert (
        '"name": "get_weather"' in accepted.prompt_text.split("<|im_end|>")[0]
    )  # offered in the system turn
    deltas = [event for event in events if isinstance(event, Delta)]
    calls = [call for delta in deltas for call in delta.tool_calls or []]
    content = "".join(delta.text for delta in deltas)
    assert content or calls  # an answer, or another call: either is parsed, never a raw marker
    assert "<tool_call>" not in content
    finished = next(event for event in events if isinstance(event, ChoiceFinished))
    assert finished.finish_reason in ("stop", "length", "tool_calls")
    assert (finished.finish_reason == "tool_calls") == bool(calls)
