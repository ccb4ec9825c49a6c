"""The OpenAI surface on ``--engine vllm``: what a client checks, identical to the native engine's.

Text, stop strings and finish reasons stay tokenferry's (the driver), so streamed and
whole answers agree, a stop string is trimmed mid-stream, logprobs and ``n`` keep their
shapes, a seed reproduces, a parameter vLLM cannot honour is a 400 naming it, and a
SIGKILLed worker's stream ends on the other worker with the same greedy text while its
vLLM engine-core process does not outlive it. The takeover test is last: it kills a worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import openai
import psutil
import pytest
from redis.asyncio import Redis

from shared import keys, registry
from tests.processes import StreamReader, chat_text
from tests.vllm.conftest import CHILD_CORE_WORKER, MODEL, WORKERS, VllmCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]


def _greedy(client: openai.OpenAI, **extra: object) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=32,
        temperature=0,
        **extra,  # type: ignore[arg-type]
    )


def test_streamed_and_whole_greedy_answers_agree(client: openai.OpenAI) -> None:
    whole = _greedy(client)
    text = whole.choices[0].message.content
    assert text and whole.usage and whole.usage.completion_tokens > 0
    assert whole.choices[0].finish_reason in ("stop", "length")
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=32, temperature=0, stream=True
    )
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    assert "".join(choice.delta.content or "" for choice in chunks) == text
    assert chunks[-1].finish_reason == whole.choices[0].finish_reason


def test_a_stop_string_is_trimmed_mid_stream(client: openai.OpenAI) -> None:
    text = _greedy(client, extra_body={"ignore_eos": True}).choices[0].message.content or ""
    words = text.split()
    assert len(words) > 4, text
    stop = words[len(words) // 2]
    expected = text[: text.index(stop)]
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=32, temperature=0, stop=[stop], stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    assert "".join(choice.delta.content or "" for choice in chunks) == expected
    assert all(stop not in (choice.delta.content or "") for choice in chunks)
    assert chunks[-1].finish_reason == "stop"


def test_logprobs_score_each_token_with_its_alternatives(client: openai.OpenAI) -> None:
    answer = _greedy(client, logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) == answer.usage.completion_tokens  # type: ignore[union-attr]
    for scored in content:
        assert len(scored.top_logprobs) == 2
        assert scored.logprob <= 0
        assert scored.top_logprobs[0].logprob == pytest.approx(scored.logprob, abs=1e-4)  # greedy: the best


def test_n_choices_and_a_seed_reproduces(client: openai.OpenAI) -> None:
    def sampled(seed: int) -> list[str]:
        answer = client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=24, temperature=1.0, n=2, seed=seed
        )
        assert [choice.index for choice in answer.choices] == [0, 1]
        return [choice.message.content or "" for choice in answer.choices]

    first = sampled(1234)
    assert sampled(1234) == first
    assert all(first)


@pytest.mark.parametrize(
    ("name", "value"), [("num_beams", 2), ("typical_p", 0.5), ("no_repeat_ngram_size", 2)]
)
def test_a_parameter_vllm_cannot_honour_is_a_400_naming_it(
    client: openai.OpenAI, name: str, value: object
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        _greedy(client, extra_body={name: value})
    body = refused.value.body
    assert isinstance(body, dict) and body.get("param") == name, body
    assert "vllm engine" in str(body.get("message"))


def test_a_json_schema_is_enforced_by_vllm(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    answer = _greedy(
        client,
        max_completion_tokens=64,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "c", "schema": schema, "strict": True},
        },
    )
    parsed = json.loads(answer.choices[0].message.content or "")
    assert set(parsed) == {"colour", "count"} and isinstance(parsed["count"], int)


def test_a_repeated_prompt_reports_the_tokens_vllm_s_prefix_cache_served(client: openai.OpenAI) -> None:
    # Long enough for many cache blocks. Two workers: of the second and third request, one lands
    # where the prompt was seen (the chat template's system prefix may be cached for all three).
    messages = [{"role": "user", "content": "Summarise: " + "the sea is wide and deep. " * 40}]
    answers = [
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)  # type: ignore[arg-type]
        for _ in range(3)
    ]
    hits = [answer.usage.prompt_tokens_details for answer in answers]  # type: ignore[union-attr]
    cached = [0 if details is None else details.cached_tokens for details in hits]
    prompt_tokens = answers[0].usage.prompt_tokens  # type: ignore[union-attr]
    assert max(cached[1:]) > cached[0] + 200, cached
    assert max(cached) < prompt_tokens


async def test_the_worker_s_threads_never_preempt_vllm_s_engine_core_in_a_child(
    vllm_cluster: VllmCluster,
) -> None:
    # That worker only relays; vLLM's engine core, its child, computes (shared/os_scheduling.py).
    redis = Redis.from_url(vllm_cluster.redis_url)
    await _both_workers_live(redis, vllm_cluster)  # its threads change policy before it goes live
    await redis.aclose()
    worker = vllm_cluster.workers[CHILD_CORE_WORKER]
    relay = [os.sched_getscheduler(thread.id) for thread in psutil.Process(worker.pid).threads()]
    assert set(relay) == {os.SCHED_BATCH}
    cores = psutil.Process(worker.pid).children(recursive=True)
    assert cores
    compute = {os.sched_getscheduler(thread.id) for core in cores for thread in core.threads()}
    assert compute == {os.SCHED_OTHER}


async def test_an_engine_core_in_the_worker_computes_there_under_one_policy(
    vllm_cluster: VllmCluster,
) -> None:
    # No child computes; the model's threads and the relays share the worker, all under SCHED_BATCH.
    redis = Redis.from_url(vllm_cluster.redis_url)
    await _both_workers_live(redis, vllm_cluster)
    await redis.aclose()
    worker = psutil.Process(vllm_cluster.workers["a"].pid)
    assert not [child for child in worker.children(recursive=True) if child.cpu_times().user > 5]
    assert len(worker.threads()) > 2
    assert {os.sched_getscheduler(thread.id) for thread in worker.threads()} == {os.SCHED_BATCH}


async def _both_workers_live(redis: Redis, cluster: VllmCluster) -> None:
    wanted = {cluster.worker_id(name) for name in WORKERS}
    deadline = time.monotonic() + 900
    while {info.worker_id for info in await registry.live_workers(redis)} < wanted:
        assert time.monotonic() < deadline, "the second vLLM worker never registered"
        assert all(worker.poll() is None for worker in cluster.workers.values())
        await asyncio.sleep(1)


async def test_zz_a_sigkilled_worker_s_stream_ends_on_the_other_with_the_same_greedy_text(
    vllm_cluster: VllmCluster,
) -> None:
    redis = Redis.from_url(vllm_cluster.redis_url)
    await _both_workers_live(redis, vllm_cluster)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=vllm_cluster.url, timeout=300) as http:
        whole = await http.post("/v1/chat/completions", json=body)
        assert whole.status_code == 200, whole.text
        expected = whole.json()["choices"][0]["message"]["content"]
        async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            stream = StreamReader(response)
            await stream.until_text(15)
            owner = (await redis.hget(keys.run(request_id), "owner")).decode()  # type: ignore[misc]
            victim_id = owner.rpartition("/")[0]
            victim = next(
                w for n, w in vllm_cluster.workers.items() if vllm_cluster.worker_id(n) == victim_id
            )
            engine_cores = psutil.Process(victim.pid).children(recursive=True)
            if victim is vllm_cluster.workers[CHILD_CORE_WORKER]:
                assert engine_cores, "vLLM's engine core runs in a child process of this worker"
            victim.send_signal(signal.SIGKILL)
            await stream.rest()
    await redis.aclose()
    assert chat_text(stream.events) == expected  # nothing lost, nothing repeated, the same tokens
    assert stream.events[-2].json()["choices"][0]["finish_reason"] == "length"
    # The killed worker's children (an engine core and its own workers) stop by themselves.
    _, alive = psutil.wait_procs(engine_cores, timeout=30)
    assert not alive, [process.cmdline() for process in alive]
