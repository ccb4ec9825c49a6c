"""OpenAI requests become the jobs we expect, and token events become OpenAI's exact objects."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.openai import render, translate
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from shared.errors import WorkerFailed
from shared.protocol import (
    Accepted,
    ChatMessage,
    ChatPrompt,
    ChoiceFinished,
    Delta,
    Finished,
    FinishReason,
    GenerationJob,
    SamplingSpec,
    TextPrompt,
    TokenEvent,
    TokenPrompt,
    Usage,
)
from shared.registry import WorkerInfo

REQUEST_ID = "0123456789abcdef0123456789abcdef"
CREATED_AT = 1_700_000_000.75


def chat_request(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def completion_request(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Once", **fields})


def events(
    *texts: str, reason: FinishReason = FinishReason.STOP, prompt_text: str | None = None
) -> list[TokenEvent]:
    accepted = Accepted(prompt_tokens=4, worker_id="w1", prompt_text=prompt_text)
    deltas = [Delta(text=text, token_ids=[index]) for index, text in enumerate(texts)]
    choice_finished = ChoiceFinished(index=0, finish_reason=reason, completion_tokens=len(texts))
    finished = Finished(finish_reason=reason, usage=Usage(prompt_tokens=4, completion_tokens=len(texts)))
    return [accepted, *deltas, choice_finished, finished]


# Requests -> jobs


def test_minimal_chat_request_becomes_a_chat_job_with_server_defaults() -> None:
    job = translate.chat_job(chat_request(), REQUEST_ID, CREATED_AT)

    assert job == GenerationJob(
        request_id=REQUEST_ID,
        model="m",
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content="Hi")]),
        sampling=SamplingSpec(),
        created_at=CREATED_AT,
    )


def test_every_sampling_field_and_hf_extra_reaches_the_spec() -> None:
    request = chat_request(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        presence_penalty=0.1,
        frequency_penalty=-0.2,
        seed=3,
        stop="END",
        top_k=40,
        typical_p=0.95,
        min_p=0.05,
        repetition_penalty=1.1,
        length_penalty=1.5,
        no_repeat_ngram_size=3,
        num_beams=2,
        min_length=2,
        ignore_eos=True,
        user="u-1",
    )

    assert translate.chat_job(request, REQUEST_ID, CREATED_AT).sampling == SamplingSpec(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        typical_p=0.95,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.1,
        frequency_penalty=-0.2,
        length_penalty=1.5,
        no_repeat_ngram_size=3,
        num_beams=2,
        min_tokens=2,
        seed=3,
        ignore_eos=True,
        stop=["END"],
    )


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    request = chat_request(max_tokens=100, max_completion_tokens=5)

    assert translate.chat_job(request, REQUEST_ID, CREATED_AT).sampling.max_tokens == 5


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(None, None), ("x", ["x"]), (["a", "b"], ["a", "b"]), ([], None)],
)
def test_stop_is_normalised_to_a_list(stop: Any, expected: list[str] | None) -> None:
    assert translate.chat_job(chat_request(stop=stop), REQUEST_ID, CREATED_AT).sampling.stop == expected


def test_top_k_minus_one_means_disabled_as_hf_spells_it() -> None:
    assert translate.chat_job(chat_request(top_k=-1), REQUEST_ID, CREATED_AT).sampling.top_k == 0


def test_developer_role_becomes_system_and_names_are_kept() -> None:
    request = chat_request(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Hi", "name": "ann"},
            {"role": "assistant", "content": "Hello"},
        ]
    )

    prompt = translate.chat_job(request, REQUEST_ID, CREATED_AT).prompt

    assert prompt == ChatPrompt(
        messages=[
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Hi", name="ann"),
            ChatMessage(role="assistant", content="Hello"),
        ]
    )


def test_text_content_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "Describe"}, {"type": "text", "text": "this."}]
    request = chat_request(messages=[{"role": "user", "content": parts}])

    prompt = translate.chat_job(request, REQUEST_ID, CREATED_AT).prompt

    assert prompt == ChatPrompt(messages=[ChatMessage(role="user", content="Describe\nthis.")])


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("Once", TextPrompt(text="Once")),
        ("", TextPrompt(text="")),
        (["Once"], TextPrompt(text="Once")),
        ([1, 2, 3], TokenPrompt(token_ids=[1, 2, 3])),
        ([[4, 5]], TokenPrompt(token_ids=[4, 5])),
    ],
)
def test_every_prompt_form_becomes_text_or_tokens(prompt: Any, expected: Any) -> None:
    job = translate.completion_jobs(completion_request(prompt=prompt), REQUEST_ID, CREATED_AT)[0]

    assert job.prompt == expected


def test_completion_job_carries_echo_and_leaves_max_tokens_to_the_worker() -> None:
    job = translate.completion_jobs(completion_request(echo=True), REQUEST_ID, CREATED_AT)[0]

    assert job.echo is True
    assert job.sampling.max_tokens is None


def test_fields_accepted_without_effect_leave_the_job_as_it_was() -> None:
    request = chat_request(
        store=False,
        metadata={"a": "b"},
        service_tier="auto",
        prompt_cache_key="k",
        safety_identifier="u1",
        prediction={"type": "content", "content": "Hello"},
        modalities=["text"],
        verbosity="medium",
        stream_options={"include_obfuscation": False},
        prompt_cache_retention="in_memory",
        prompt_cache_options={"mode": "implicit", "ttl": "30m"},
        skip_special_tokens=True,
        include_stop_str_in_output=False,
        spaces_between_special_tokens=False,
        continue_final_message=False,
    )

    assert translate.chat_job(request, REQUEST_ID, CREATED_AT) == translate.chat_job(
        chat_request(), REQUEST_ID, CREATED_AT
    )


def test_unknown_fields_are_refused_by_name() -> None:
    with pytest.raises(ValidationError) as caught:
        chat_request(guided_whitespace_pattern=" ")

    assert caught.value.errors()[0]["loc"] == ("guided_whitespace_pattern",)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"tool_choice": "any"}, "tool_choice"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"logit_bias": {"one": 5}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"response_format": {"type": "regex"}}, "response_format.type"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"temperature": 2.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content"),
    ],
)
def test_unsupported_or_invalid_chat_fields_are_refused_by_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        chat_request(**fields)

    assert ".".join(str(part) for part in caught.value.errors()[0]["loc"]) == param


def test_accepted_defaults_of_refused_features_pass() -> None:
    request = chat_request(
        tools=[], tool_choice="none", logprobs=False, n=1, response_format={"type": "text"}
    )

    assert translate.chat_job(request, REQUEST_ID, CREATED_AT).model == "m"


@pytest.mark.parametrize("prompt", [[], [-1], [True], [[]], [["a"]], ["a", 1], [[1], [-2]], ["x"] * 65])
def test_unusable_prompts_are_refused(prompt: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        completion_request(prompt=prompt)

    assert caught.value.errors()[0]["loc"] == ("prompt",)


# Events -> objects


def test_events_fold_into_a_chat_completion() -> None:
    meta = translate.chat_meta(chat_request(), REQUEST_ID, CREATED_AT)

    completion = render.chat_completion(meta, events("Hel", "lo"))

    assert completion.model_dump(mode="json") == {
        "id": f"chatcmpl-{REQUEST_ID}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }


def test_events_fold_into_a_text_completion_with_echo() -> None:
    meta = translate.completion_meta(completion_request(echo=True), REQUEST_ID, CREATED_AT)

    completion = render.text_completion(
        meta, [events(" upon", reason=FinishReason.LENGTH, prompt_text="Once")]
    )

    assert completion.model_dump(mode="json") == {
        "id": f"cmpl-{REQUEST_ID}",
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [{"text": "Once upon", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
    }


def test_events_without_finished_are_a_worker_failure() -> None:
    meta = translate.chat_meta(chat_request(), REQUEST_ID, CREATED_AT)

    with pytest.raises(WorkerFailed):
        render.chat_completion(meta, events("x")[:-1])


def chat_chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{REQUEST_ID}",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "m",
        "choices": choices,
        **extra,
    }


def chunk_choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def test_chat_events_become_openai_chunks_without_usage_by_default() -> None:
    stream = render.ChatStream(translate.chat_meta(chat_request(stream=True), REQUEST_ID, CREATED_AT))

    chunks = [chunk.model_dump(mode="json") for event in events("Hi", "") for chunk in stream.chunks(event)]

    assert chunks == [
        chat_chunk([chunk_choice({"role": "assistant", "content": ""})]),
        chat_chunk([chunk_choice({"content": "Hi"})]),
        chat_chunk([chunk_choice({}, "stop")]),
    ]


def test_include_usage_adds_null_usage_and_a_final_usage_chunk() -> None:
    request = chat_request(stream=True, stream_options={"include_usage": True})
    stream = render.ChatStream(translate.chat_meta(request, REQUEST_ID, CREATED_AT))

    chunks = [chunk.model_dump(mode="json") for event in events("Hi") for chunk in stream.chunks(event)]

    assert chunks == [
        chat_chunk([chunk_choice({"role": "assistant", "content": ""})], usage=None),
        chat_chunk([chunk_choice({"content": "Hi"})], usage=None),
        chat_chunk([chunk_choice({}, "stop")], usage=None),
        chat_chunk([], usage={"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}),
    ]


def test_completion_events_become_text_chunks_with_the_echo_first() -> None:
    request = completion_request(stream=True, echo=True, stream_options={"include_usage": True})
    stream = render.CompletionStream(translate.completion_meta(request, REQUEST_ID, CREATED_AT))

    chunks = [
        chunk.model_dump(mode="json")
        for event in events(" upon", prompt_text="Once")
        for chunk in stream.chunks(event)
    ]

    def text_chunk(choices: list[dict[str, Any]], usage: Any = None) -> dict[str, Any]:
        return {
            "id": f"cmpl-{REQUEST_ID}",
            "object": "text_completion",
            "created": 1_700_000_000,
            "model": "m",
            "choices": choices,
            "usage": usage,
        }

    def choice(text: str, finish_reason: str | None = None) -> dict[str, Any]:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}

    assert chunks == [
        text_chunk([choice("Once")]),
        text_chunk([choice(" upon")]),
        text_chunk([choice("", "stop")]),
        text_chunk([], usage={"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}),
    ]


def test_usage_is_omitted_from_chunk_json_unless_asked_for() -> None:
    meta = translate.completion_meta(completion_request(stream=True), REQUEST_ID, CREATED_AT)

    (chunk,) = render.CompletionStream(meta).chunks(Delta(text="x", token_ids=[1]))

    assert "usage" not in chunk.model_dump_json()


def test_models_are_listed_once_each_with_their_smallest_window() -> None:
    workers = [
        WorkerInfo(worker_id="a", model="m2", max_model_len=4096, started_at=20.5),
        WorkerInfo(worker_id="b", model="m1", max_model_len=2048, started_at=30.0),
        WorkerInfo(worker_id="c", model="m2", max_model_len=2048, started_at=10.2),
    ]

    assert translate.model_list(workers).model_dump() == {
        "object": "list",
        "data": [
            {"id": "m1", "object": "model", "created": 30, "owned_by": "tokenferry", "max_model_len": 2048},
            {"id": "m2", "object": "model", "created": 10, "owned_by": "tokenferry", "max_model_len": 2048},
        ],
    }


def test_every_served_name_of_a_model_gets_a_card() -> None:
    workers = [WorkerInfo(worker_id="a", model="m", aliases=("alias",), max_model_len=512, started_at=3.0)]

    assert [card.id for card in translate.model_list(workers).data] == ["alias", "m"]


def test_logit_bias_keys_become_token_ids() -> None:
    request = chat_request(logit_bias={"15": 2.5, "7": -100})
    assert translate.chat_job(request, REQUEST_ID, CREATED_AT).sampling.logit_bias == {15: 2.5, 7: -100.0}


def test_only_requests_with_a_schema_grammar_or_tools_are_translated_off_the_event_loop() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    schema = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}
    assert not translate.compiles_grammars(chat_request())
    assert not translate.compiles_grammars(completion_request(max_tokens=4))
    assert translate.compiles_grammars(chat_request(tools=[tool]))
    assert translate.compiles_grammars(chat_request(response_format=schema))
    assert translate.compiles_grammars(chat_request(response_format={"type": "json_object"}))
    assert translate.compiles_grammars(completion_request(guided_regex="[a-z]+"))
    assert translate.compiles_grammars(chat_request(structured_outputs={"choice": ["a", "b"]}))
