"""The whole request path in one process: gateway app -> real Redis -> real arq worker -> fake engine."""

from __future__ import annotations

import openai
import pytest
from dirty_equals import IsInt, IsStr

from shared.settings import WorkerSettings
from tests.helpers import FAKE_MODEL, chat_body, parse_sse, running_stack

SCRIPT = WorkerSettings.model_fields["fake_script"].default
SCRIPT_TOKENS = len(SCRIPT.encode())  # the fake tokenizer is byte-level


async def test_non_streaming_chat_returns_the_whole_answer_and_usage(redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 200
    assert response.headers["x-request-id"]
    assert response.json() == {
        "id": IsStr(regex=r"chatcmpl-\w+"),
        "object": "chat.completion",
        "created": IsInt(),
        "model": FAKE_MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": SCRIPT},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": len(b"user: Hi\nassistant:"),
            "completion_tokens": SCRIPT_TOKENS + 1,  # the EOS token counts
            "total_tokens": len(b"user: Hi\nassistant:") + SCRIPT_TOKENS + 1,
        },
    }


async def test_streamed_chat_reassembles_multibyte_text_and_ends_with_done(redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": True})
        )
    payloads = parse_sse(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks if chunk["choices"])
    assert text == SCRIPT
    assert "\ufffd" not in text
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == SCRIPT_TOKENS + 1


async def test_max_tokens_gives_exactly_that_many_tokens_and_length(redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
    body = response.json()
    assert body["choices"][0]["message"]["content"] == SCRIPT[:5]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


async def test_stop_sequence_split_across_tokens_never_reaches_the_stream(redis_url: str) -> None:
    # Each byte is a token, so "brown" arrives over five tokens.
    async with running_stack(redis_url) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(stream=True, stop=["brown", "zzz"])
        )
    chunks = parse_sse(response.text)[:-1]
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    assert text == "The quick "
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_server_default_stop_applies_when_the_request_sets_none(redis_url: str) -> None:
    async with running_stack(redis_url, stop_sequences=["fox"]) as client:
        response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.json()["choices"][0]["message"]["content"] == "The quick brown "


async def test_ignore_eos_keeps_generating_to_max_tokens(redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        response = await client.post(
            "/v1/completions",
            json={"model": FAKE_MODEL, "prompt": "x", "max_tokens": SCRIPT_TOKENS + 10, "ignore_eos": True},
        )
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["text"].startswith(SCRIPT)
    assert response.json()["usage"]["completion_tokens"] == SCRIPT_TOKENS + 10


async def test_server_ignore_eos_default_is_overridden_by_the_request(redis_url: str) -> None:
    async with running_stack(redis_url, ignore_eos=True) as client:
        forced = await client.post(
            "/v1/completions", json={"model": FAKE_MODEL, "prompt": "x", "max_tokens": 200}
        )
        honoured = await client.post(
            "/v1/completions",
            json={"model": FAKE_MODEL, "prompt": "x", "max_tokens": 200, "ignore_eos": False},
        )
    assert forced.json()["choices"][0]["finish_reason"] == "length"
    assert honoured.json()["choices"][0]["finish_reason"] == "stop"


async def test_completion_echo_prepends_the_prompt(redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        response = await client.post(
            "/v1/completions",
            json={"model": FAKE_MODEL, "prompt": "Once upon", "max_tokens": 3, "echo": True},
        )
    assert response.json()["choices"][0]["text"] == "Once upon" + SCRIPT[:3]


async def test_prompt_beyond_the_context_window_is_a_400_before_any_sse_byte(redis_url: str) -> None:
    async with running_stack(redis_url, max_model_len=32) as client:
        response = await client.post(
            "/v1/completions", json={"model": FAKE_MODEL, "prompt": "y" * 40, "stream": True}
        )
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["code"] == "context_length_exceeded"


async def test_max_tokens_beyond_the_context_window_is_rejected(redis_url: str) -> None:
    async with running_stack(redis_url, max_model_len=64) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=100))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


async def test_seeded_sampling_is_reproducible_and_seed_dependent(redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        texts = []
        for seed in (7, 7, 8):
            response = await client.post(
                "/v1/chat/completions", json=chat_body(temperature=1.0, seed=seed, max_tokens=12)
            )
            texts.append(response.json()["choices"][0]["message"]["content"])
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


async def test_official_openai_sdk_streams_through_the_stack(redis_url: str) -> None:
    async with running_stack(redis_url) as client:
        sdk = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
        stream = await sdk.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True, max_tokens=9
        )
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream]
        completion = await sdk.completions.create(model=FAKE_MODEL, prompt="Hi", max_tokens=4)
    assert "".join(pieces) == SCRIPT[:9]
    assert completion.choices[0].text == SCRIPT[:4]
    assert completion.usage is not None and completion.usage.completion_tokens == 4


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_unknown_model_is_404(redis_url: str, path: str) -> None:
    async with running_stack(redis_url) as client:
        # Each route's own body: a field of the other route is an unknown argument, a 400 (as OpenAI).
        body = (
            {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
        )
        response = await client.post(path, json={"model": "nope", **body})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
