"""n choices, logprobs, prompt lists and tokenize, through the whole stack with the official openai SDK.

Real Redis, a real arq worker with the fake engine (byte tokens, scripted text,
made-up but deterministic logprobs), the real gateway app in process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from shared.settings import WorkerSettings
from tests.helpers import FAKE_MODEL, running_stack
from worker.engine.fake import fake_score

SCRIPT = WorkerSettings.model_fields["fake_script"].default
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
async def stack(redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, openai.AsyncOpenAI]]:
    async with running_stack(redis_url) as client:
        yield (
            client,
            openai.AsyncOpenAI(
                base_url="http://testserver/v1", api_key="x", http_client=client, max_retries=0
            ),
        )


Stack = tuple[httpx.AsyncClient, openai.AsyncOpenAI]


async def test_n_choices_are_indexed_seeded_per_choice_and_counted(stack: Stack) -> None:
    _, sdk = stack
    asked: dict[str, Any] = {
        "model": FAKE_MODEL,
        "messages": HI,
        "temperature": 1.0,
        "seed": 7,
        "max_tokens": 6,
    }
    three = await sdk.chat.completions.create(n=3, **asked)
    again = await sdk.chat.completions.create(n=3, **asked)
    single = await sdk.chat.completions.create(**{**asked, "seed": 8})
    assert [choice.index for choice in three.choices] == [0, 1, 2]
    assert {choice.finish_reason for choice in three.choices} == {"length"}
    texts = [choice.message.content for choice in three.choices]
    assert len(set(texts)) == 3  # seeds 7, 8, 9: different choices
    assert texts == [choice.message.content for choice in again.choices]  # and reproducible
    assert texts[1] == single.choices[0].message.content  # choice 1 samples with seed + 1
    assert three.usage is not None and three.usage.completion_tokens == 18
    assert three.usage.prompt_tokens == single.usage.prompt_tokens  # type: ignore[union-attr]


async def test_streamed_n_choices_each_end_and_usage_comes_once(stack: Stack) -> None:
    _, sdk = stack
    asked: dict[str, Any] = {
        "model": FAKE_MODEL,
        "messages": HI,
        "temperature": 1.0,
        "seed": 3,
        "max_tokens": 6,
    }
    whole = await sdk.chat.completions.create(n=3, **asked)
    stream = await sdk.chat.completions.create(
        n=3, stream=True, stream_options={"include_usage": True}, **asked
    )
    texts = {index: "" for index in range(3)}
    finishes: dict[int, str] = {}
    usages = []
    async for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {choice.index: choice.message.content for choice in whole.choices}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert len(usages) == 1 and usages[0].completion_tokens == 18


async def test_chat_logprobs_name_each_token_with_its_top_alternatives(stack: Stack) -> None:
    _, sdk = stack
    answer = await sdk.chat.completions.create(
        model=FAKE_MODEL,
        messages=HI,
        max_tokens=5,
        logprobs=True,
        top_logprobs=3,  # type: ignore[arg-type]
    )
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert "".join(entry.token for entry in content) == choice.message.content == SCRIPT[:5]
    for entry, byte in zip(content, SCRIPT[:5].encode(), strict=True):
        assert entry.logprob == pytest.approx(fake_score(byte, 3).logprob)
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token


async def test_streamed_chat_logprobs_cover_every_token(stack: Stack) -> None:
    _, sdk = stack
    stream = await sdk.chat.completions.create(
        model=FAKE_MODEL,
        messages=HI,
        max_tokens=8,
        logprobs=True,
        stream=True,  # type: ignore[arg-type]
    )
    tokens = [
        entry.token
        async for chunk in stream
        for choice in chunk.choices
        if choice.logprobs and choice.logprobs.content
        for entry in choice.logprobs.content
    ]
    assert "".join(tokens) == SCRIPT[:8]


async def test_completion_logprobs_have_offsets_tokens_and_top_maps(stack: Stack) -> None:
    _, sdk = stack
    answer = await sdk.completions.create(model=FAKE_MODEL, prompt="Hi", max_tokens=4, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == list(SCRIPT[:4])
    assert logprobs.text_offset == [0, 1, 2, 3]
    assert logprobs.token_logprobs == [pytest.approx(fake_score(b, 2).logprob) for b in SCRIPT[:4].encode()]
    assert logprobs.top_logprobs is not None and all(
        token in top and len(top) == 2
        for token, top in zip(logprobs.tokens, logprobs.top_logprobs, strict=True)
    )


async def test_echo_with_logprobs_scores_the_prompt_first(stack: Stack) -> None:
    _, sdk = stack
    whole = await sdk.completions.create(model=FAKE_MODEL, prompt="Hi", max_tokens=3, logprobs=1, echo=True)
    choice = whole.choices[0]
    assert choice.text == "Hi" + SCRIPT[:3]
    assert choice.logprobs is not None and choice.logprobs.tokens == ["H", "i", *SCRIPT[:3]]
    assert choice.logprobs.token_logprobs is not None and choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.text_offset == [0, 1, 2, 3, 4]
    stream = await sdk.completions.create(
        model=FAKE_MODEL, prompt="Hi", max_tokens=3, logprobs=1, echo=True, stream=True
    )
    chunks = [chunk.choices[0] async for chunk in stream if chunk.choices]
    assert "".join(c.text for c in chunks) == choice.text
    offsets = [offset for c in chunks if c.logprobs for offset in c.logprobs.text_offset or []]
    assert offsets == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("prompt", "echoes"),
    [(["ab", "c"], ["ab", "c"]), ([[97, 98], [99]], ["ab", "c"]), ([97, 98], ["ab"])],
)
async def test_prompt_lists_give_n_choices_per_prompt_in_order(
    stack: Stack, prompt: Any, echoes: list[str]
) -> None:
    _, sdk = stack
    answer = await sdk.completions.create(model=FAKE_MODEL, prompt=prompt, n=2, max_tokens=3, echo=True)
    assert [choice.index for choice in answer.choices] == list(range(2 * len(echoes)))
    assert [choice.text for choice in answer.choices] == [echo + SCRIPT[:3] for echo in echoes for _ in "ij"]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == sum(len(echo) for echo in echoes)
    assert answer.usage.completion_tokens == 3 * len(answer.choices)


async def test_streamed_prompt_list_merges_every_choice(stack: Stack) -> None:
    _, sdk = stack
    stream = await sdk.completions.create(
        model=FAKE_MODEL,
        prompt=["ab", "c", "d"],
        max_tokens=4,
        echo=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usages = []
    async for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: "ab" + SCRIPT[:4], 1: "c" + SCRIPT[:4], 2: "d" + SCRIPT[:4]}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert len(usages) == 1 and usages[0].prompt_tokens == 4 and usages[0].completion_tokens == 12


async def test_tokenize_and_detokenize_round_trip(stack: Stack) -> None:
    client, _ = stack
    text = "Voilà ☕"
    tokenized = await client.post("/tokenize", json={"model": FAKE_MODEL, "prompt": text})
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json() == {
        "count": len(text.encode()),
        "max_model_len": 4096,
        "tokens": list(text.encode()),
    }
    back = await client.post("/detokenize", json={"model": FAKE_MODEL, "tokens": tokenized.json()["tokens"]})
    assert back.json() == {"prompt": text}
    chat = await client.post("/tokenize", json={"model": FAKE_MODEL, "messages": HI})
    assert chat.json()["tokens"] == list(b"user: Hi\nassistant:")


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"model": FAKE_MODEL}, 400, "prompt"),
        ("/detokenize", {"model": FAKE_MODEL, "tokens": [300]}, 400, "tokens"),
        ("/detokenize", {"model": FAKE_MODEL, "tokens": "x"}, 400, "tokens"),
    ],
)
async def test_tokenizer_errors_are_openai_errors(
    stack: Stack, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    client, _ = stack
    response = await client.post(path, json=body)
    assert response.status_code == status
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/chat/completions", {"n": 17}, "n"),
        ("/v1/chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ("/v1/chat/completions", {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
        ("/v1/chat/completions", {"guided_regex": "("}, "guided_regex"),
        (
            "/v1/completions",
            {"response_format": {"type": "json_object"}, "guided_choice": ["a"]},
            "guided_choice",
        ),
        ("/v1/chat/completions", {"logprobs": True, "num_beams": 2}, "logprobs"),
        ("/v1/chat/completions", {"n": 2, "num_beams": 2}, "n"),
        ("/v1/chat/completions", {"max_completion_tokens": 100_000}, "messages"),
        ("/v1/completions", {"suffix": "!"}, "suffix"),
        ("/v1/completions", {"best_of": 3, "n": 2}, "best_of"),
        ("/v1/completions", {"prompt": [[1], []]}, "prompt"),
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": ["x", "y" * 5000], "max_tokens": 1}, "messages"),
    ],
)
async def test_bad_inputs_are_400s_naming_the_param(
    stack: Stack, path: str, fields: dict[str, Any], param: str
) -> None:
    client, _ = stack
    prompt: dict[str, Any] = {"messages": HI} if path.endswith("chat/completions") else {"prompt": "x"}
    base: dict[str, Any] = {"model": FAKE_MODEL, **prompt}
    response = await client.post(path, json={**base, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_accepted_openai_fields_pass(stack: Stack) -> None:
    _, sdk = stack
    answer = await sdk.chat.completions.create(
        model=FAKE_MODEL,
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Hi"}]},
        ],
        user="u-1",
        response_format={"type": "text"},
        max_completion_tokens=3,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={"65": 1.0},
        seed=1,
        extra_body={"top_k": 5, "repetition_penalty": 1.1},
        store=False,
        metadata={"run": "1"},
        prompt_cache_key="conversation-1",
        safety_identifier="u-1",
        service_tier="auto",
    )
    assert answer.choices[0].message.content == SCRIPT[:3]
