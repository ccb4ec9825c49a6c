"""previous_response_id: stored responses continue their conversation, for their tenant, until they expire.

A real gateway and a fake-engine worker on a real Redis. The fake worker renders
a chat as ``role: content`` lines and counts one token per byte, so a
continuation's ``input_tokens`` tells exactly which conversation reached the
worker: the stored one (its input and output) followed by the new input.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis

from shared.protocol import ChatMessage
from shared.settings import WorkerSettings
from tests.helpers import FAKE_MODEL, bearer, parse_sse, running_stack, until
from worker.engine.fake import ByteTokenizer

KEY_A = "sk-conversation-a-0123456789"
KEY_B = "sk-conversation-b-0123456789"
SCRIPT = WorkerSettings.model_fields["fake_script"].default
MAX_TOKENS = 8
FIRST_ANSWER = SCRIPT.encode()[:MAX_TOKENS].decode()


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "input": text, "max_output_tokens": MAX_TOKENS, **extra}


def prompt_tokens(*messages: tuple[str, str]) -> int:
    chat = [ChatMessage(role=role, content=content) for role, content in messages]
    return len(ByteTokenizer().render_chat(chat, add_generation_prompt=True).encode())


async def create(client: httpx.AsyncClient, key: str, **fields: Any) -> httpx.Response:
    return await client.post("/v1/responses", json=fields, headers=bearer(key))


async def test_a_response_continues_from_the_stored_conversation_without_its_instructions(
    redis: Redis, redis_url: str
) -> None:
    async with running_stack(redis_url, gateway={"api_keys": [KEY_A]}) as client:
        first = (await create(client, KEY_A, **body("Hi", instructions="Be terse."))).json()
        assert first["status"] == "incomplete" and first["store"] is True
        second = await create(client, KEY_A, **body("And?", previous_response_id=first["id"]))
        assert second.status_code == 200, second.text
        answer = second.json()
        assert answer["previous_response_id"] == first["id"]
        assert answer["usage"]["input_tokens"] == prompt_tokens(
            ("user", "Hi"), ("assistant", FIRST_ANSWER), ("user", "And?")
        )
        # A chain: the third sees both earlier turns.
        third = (await create(client, KEY_A, **body("More.", previous_response_id=answer["id"]))).json()
        assert third["usage"]["input_tokens"] == prompt_tokens(
            ("user", "Hi"), ("assistant", FIRST_ANSWER), ("user", "And?"),
            ("assistant", FIRST_ANSWER), ("user", "More."),
        )  # fmt: skip
        retrieved = await client.get(f"/v1/responses/{first['id']}", headers=bearer(KEY_A))
        assert retrieved.status_code == 200 and retrieved.json()["output"] == first["output"]


async def test_a_streamed_response_is_stored_once_it_ends_and_continues(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, gateway={"api_keys": [KEY_A]}) as client:
        streamed = await create(client, KEY_A, **body("Hi", stream=True))
        events = [event for event in parse_sse(streamed.text) if isinstance(event, dict)]
        response_id = events[-1]["response"]["id"]
        second = (await create(client, KEY_A, **body("And?", previous_response_id=response_id))).json()
        assert second["usage"]["input_tokens"] == prompt_tokens(
            ("user", "Hi"), ("assistant", FIRST_ANSWER), ("user", "And?")
        )


async def test_a_background_response_continues_once_it_has_finished(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, gateway={"api_keys": [KEY_A]}, fake_step_delay_s=0.05) as client:
        started = (await create(client, KEY_A, **body("Hi", background=True))).json()
        early = await create(client, KEY_A, **body("And?", previous_response_id=started["id"]))
        assert early.status_code == 400 and early.json()["error"]["param"] == "previous_response_id"

        async def has_ended() -> bool:
            got = await client.get(f"/v1/responses/{started['id']}", headers=bearer(KEY_A))
            return bool(got.json()["status"] == "incomplete")

        await until(has_ended)
        second = (await create(client, KEY_A, **body("And?", previous_response_id=started["id"]))).json()
        assert second["usage"]["input_tokens"] == prompt_tokens(
            ("user", "Hi"), ("assistant", FIRST_ANSWER), ("user", "And?")
        )


async def test_another_tenant_can_neither_continue_nor_read_a_response(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, gateway={"api_keys": [KEY_A, KEY_B]}) as client:
        first = (await create(client, KEY_A, **body("Hi"))).json()
        foreign = await create(client, KEY_B, **body("And?", previous_response_id=first["id"]))
        made_up = await create(client, KEY_B, **body("And?", previous_response_id="resp_" + "0" * 32))
        for refused in (foreign, made_up):
            assert refused.status_code == 404
            assert refused.json()["error"]["param"] == "previous_response_id"
        assert foreign.json()["error"]["message"].replace(first["id"], "ID") == made_up.json()["error"][
            "message"
        ].replace("resp_" + "0" * 32, "ID")
        assert (await client.get(f"/v1/responses/{first['id']}", headers=bearer(KEY_B))).status_code == 404
        own = await create(client, KEY_A, **body("And?", previous_response_id=first["id"]))
        assert own.status_code == 200


async def test_a_response_asked_not_to_be_stored_cannot_be_continued(redis: Redis, redis_url: str) -> None:
    async with running_stack(redis_url, gateway={"api_keys": [KEY_A]}) as client:
        first = (await create(client, KEY_A, **body("Hi", store=False))).json()
        assert first["store"] is False
        refused = await create(client, KEY_A, **body("And?", previous_response_id=first["id"]))
        assert refused.status_code == 404 and refused.json()["error"]["param"] == "previous_response_id"
        background = await create(client, KEY_A, **body("Hi", store=False, background=True))
        assert background.status_code == 400 and background.json()["error"]["param"] == "store"


async def test_a_stored_response_expires_after_the_retention_time(redis: Redis, redis_url: str) -> None:
    gateway = {"api_keys": [KEY_A], "result_retention_s": 1}
    async with running_stack(redis_url, gateway=gateway) as client:
        first = (await create(client, KEY_A, **body("Hi"))).json()

        async def is_gone() -> bool:
            got = await create(client, KEY_A, **body("And?", previous_response_id=first["id"]))
            return got.status_code == 404

        await until(is_gone, timeout_s=10)
        assert (await client.get(f"/v1/responses/{first['id']}", headers=bearer(KEY_A))).status_code == 404


async def test_the_openai_sdk_sends_tools_formats_and_call_outputs_the_gateway_accepts(
    redis: Redis, redis_url: str
) -> None:
    # The fake engine does not shape its script; what the model outputs is the e2e tests'.
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": False}
    async with running_stack(redis_url, gateway={"api_keys": [KEY_A]}) as client:
        sdk = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=KEY_A, http_client=client)
        first = await sdk.responses.create(
            model=FAKE_MODEL,
            input="Weather?",
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            max_output_tokens=MAX_TOKENS,
        )
        assert (first.tool_choice.type, first.parallel_tool_calls) == ("function", False)  # type: ignore[union-attr]
        assert [t.name for t in first.tools] == ["get_weather"]  # type: ignore[union-attr]
        second = await sdk.responses.create(
            model=FAKE_MODEL,
            previous_response_id=first.id,
            input=[
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            ],
            text={
                "format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}
            },
            max_output_tokens=MAX_TOKENS,
        )
        assert second.text.format.type == "json_schema"  # type: ignore[union-attr]
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(
                model=FAKE_MODEL, input="Hi", tools=[{"type": "web_search"}], max_output_tokens=MAX_TOKENS
            )
        assert refused.value.body["param"] == "tools.0.type"  # type: ignore[index]
