"""n choices, logprobs and prompt lists: requests become the right jobs, events the exact OpenAI objects."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.dispatch import fanout
from gateway.openai import render, translate
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from gateway.tokenize.schema import DetokenizeRequest, TokenizeRequest
from shared.errors import InvalidRequest
from shared.protocol import (
    Accepted,
    ChatPrompt,
    ChoiceFinished,
    Delta,
    Finished,
    FinishReason,
    PromptLogprob,
    TextPrompt,
    TokenEvent,
    TokenLogprob,
    TokenPrompt,
    TopLogprob,
    Usage,
)

RID = "r1"
CREATED = 1_700_000_000.0


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )


def completion(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Once", **fields})


def scored(token: str, logprob: float, *alternatives: tuple[str, float]) -> TokenLogprob:
    top = [TopLogprob(token_id=ord(text[0]), token=text, logprob=value) for text, value in alternatives]
    return TokenLogprob(token_id=ord(token[0]), token=token, logprob=logprob, top=top)


def two_choices() -> list[TokenEvent]:
    return [
        Accepted(prompt_tokens=3, worker_id="w"),
        Delta(text="a", token_ids=[97], index=0),
        Delta(text="b", token_ids=[98], index=1),
        ChoiceFinished(index=1, finish_reason=FinishReason.STOP, completion_tokens=1),
        Delta(text="c", token_ids=[99], index=0),
        ChoiceFinished(index=0, finish_reason=FinishReason.LENGTH, completion_tokens=2),
        Finished(finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=3, completion_tokens=3)),
    ]


# Requests -> jobs


def test_n_and_logprobs_reach_the_chat_job() -> None:
    job = translate.chat_job(chat(n=3, logprobs=True, top_logprobs=4), RID, CREATED)
    assert (job.n, job.logprobs, job.prompt_logprobs) == (3, 4, None)
    assert translate.chat_job(chat(logprobs=True), RID, CREATED).logprobs == 0
    assert translate.chat_job(chat(logprobs=False, top_logprobs=0), RID, CREATED).logprobs is None


def test_top_logprobs_without_logprobs_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequest) as caught:
        translate.chat_job(chat(top_logprobs=2), RID, CREATED)
    assert caught.value.param == "top_logprobs"


def test_n_beyond_the_operator_limit_is_refused_by_name() -> None:
    translate.check_choice_count(chat(n=4), max_n=4)
    with pytest.raises(InvalidRequest) as caught:
        translate.check_choice_count(chat(n=5), max_n=4)
    assert caught.value.param == "n"


def test_each_prompt_of_a_list_becomes_its_own_job() -> None:
    request = completion(prompt=["a", "b"], n=2, logprobs=1, echo=True)
    jobs = translate.completion_jobs(request, RID, CREATED)
    assert [job.request_id for job in jobs] == ["r1-p0", "r1-p1"]
    assert [job.prompt for job in jobs] == [TextPrompt(text="a"), TextPrompt(text="b")]
    assert {(job.n, job.logprobs, job.prompt_logprobs) for job in jobs} == {(2, 1, 1)}


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ([[1, 2], [3]], [TokenPrompt(token_ids=[1, 2]), TokenPrompt(token_ids=[3])]),
        (["x", [7]], [TextPrompt(text="x"), TokenPrompt(token_ids=[7])]),
        ([5, 6], [TokenPrompt(token_ids=[5, 6])]),
    ],
)
def test_token_prompts_and_mixed_lists(prompt: Any, expected: list[Any]) -> None:
    jobs = translate.completion_jobs(completion(prompt=prompt), RID, CREATED)
    assert [job.prompt for job in jobs] == expected


def test_one_prompt_keeps_the_request_id_and_echo_without_logprobs_scores_no_prompt() -> None:
    (job,) = translate.completion_jobs(completion(echo=True), RID, CREATED)
    assert (job.request_id, job.prompt_logprobs) == (RID, None)


@pytest.mark.parametrize(("best_of", "is_accepted"), [(None, True), (2, True), (3, False)])
def test_best_of_is_accepted_only_equal_to_n(best_of: int | None, is_accepted: bool) -> None:
    request = completion(n=2, best_of=best_of)
    if is_accepted:
        translate.completion_jobs(request, RID, CREATED)
        return
    with pytest.raises(InvalidRequest) as caught:
        translate.completion_jobs(request, RID, CREATED)
    assert caught.value.param == "best_of"


def test_tokenize_requests_become_jobs_with_vllm_special_token_defaults() -> None:
    text = translate.tokenize_job(TokenizeRequest(model="m", prompt="hi"), RID)
    chat_job = translate.tokenize_job(
        TokenizeRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), RID
    )
    assert (text.prompt, text.add_special_tokens) == (TextPrompt(text="hi"), True)
    assert isinstance(chat_job.prompt, ChatPrompt) and chat_job.add_special_tokens is False
    assert translate.detokenize_job(DetokenizeRequest(model="m", tokens=[1, 2]), RID).prompt == TokenPrompt(
        token_ids=[1, 2]
    )
    with pytest.raises(InvalidRequest):
        translate.tokenize_job(TokenizeRequest(model="m"), RID)
    with pytest.raises(InvalidRequest):
        translate.detokenize_job(DetokenizeRequest(model="m", tokens=[-1]), RID)


# Events -> objects


def test_n_choices_fold_with_their_own_text_and_finish_reason() -> None:
    meta = translate.chat_meta(chat(n=2), RID, CREATED)
    completion_object = render.chat_completion(meta, two_choices())
    assert [(c.index, c.message.content, c.finish_reason) for c in completion_object.choices] == [
        (0, "ac", "length"),
        (1, "b", "stop"),
    ]
    assert completion_object.usage.completion_tokens == 3


def test_chat_logprobs_have_openai_shape() -> None:
    events = [
        Accepted(prompt_tokens=1, worker_id="w"),
        Delta(text="é", token_ids=[1], logprobs=[scored("é", -0.5, ("é", -0.5), ("e", -1.5))]),
        ChoiceFinished(index=0, finish_reason=FinishReason.STOP, completion_tokens=1),
        Finished(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=1, completion_tokens=1)),
    ]
    choice = render.chat_completion(translate.chat_meta(chat(), RID, CREATED), events).choices[0]
    assert choice.model_dump(mode="json")["logprobs"] == {
        "content": [
            {
                "token": "é",
                "logprob": -0.5,
                "bytes": [195, 169],
                "top_logprobs": [
                    {"token": "é", "logprob": -0.5, "bytes": [195, 169]},
                    {"token": "e", "logprob": -1.5, "bytes": [101]},
                ],
            }
        ],
        "refusal": None,
    }


def test_completion_logprobs_with_echo_start_with_the_prompt() -> None:
    prompt_logprobs = [
        PromptLogprob(token_id=79, token="O", logprob=None),
        PromptLogprob(token_id=110, token="n", logprob=-2.0),
    ]
    events = [
        Accepted(prompt_tokens=2, worker_id="w", prompt_text="On"),
        Delta(text="e", token_ids=[101], logprobs=[scored("e", -0.1)], prompt_logprobs=prompt_logprobs),
        Delta(text="!", token_ids=[33], logprobs=[scored("!", -0.2, ("!", -0.2))]),
        ChoiceFinished(index=0, finish_reason=FinishReason.LENGTH, completion_tokens=2),
        Finished(finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=2, completion_tokens=2)),
    ]
    meta = translate.completion_meta(completion(prompt="On", echo=True, logprobs=1), RID, CREATED)
    choice = render.text_completion(meta, [events]).choices[0]
    assert choice.text == "One!"
    assert choice.model_dump(mode="json")["logprobs"] == {
        "text_offset": [0, 1, 2, 3],
        "token_logprobs": [None, -2.0, -0.1, -0.2],
        "tokens": ["O", "n", "e", "!"],
        "top_logprobs": [None, {"n": -2.0}, {"e": -0.1}, {"!": -0.2}],
    }


def test_streamed_completion_defers_the_echo_to_its_logprobs_and_keeps_offsets_running() -> None:
    meta = translate.completion_meta(
        completion(prompt="On", echo=True, logprobs=0, stream=True), RID, CREATED
    )
    stream = render.CompletionStream(meta)
    prompt_logprobs = [PromptLogprob(token_id=79, token="O", logprob=None)]
    assert stream.chunks(Accepted(prompt_tokens=1, worker_id="w", prompt_text="O")) == []
    first = stream.chunks(
        Delta(text="e", token_ids=[1], logprobs=[scored("e", -0.1)], prompt_logprobs=prompt_logprobs)
    )
    second = stream.chunks(Delta(text="x", token_ids=[2], logprobs=[scored("x", -0.3)]))
    assert first[0].choices[0].text == "Oe"
    assert first[0].choices[0].logprobs is not None and first[0].choices[0].logprobs.text_offset == [0, 1]
    assert second[0].choices[0].logprobs is not None and second[0].choices[0].logprobs.text_offset == [2]


def test_streamed_chat_with_n_sends_a_role_and_a_finish_per_choice_then_usage_once() -> None:
    meta = translate.chat_meta(chat(n=2, stream=True, stream_options={"include_usage": True}), RID, CREATED)
    stream = render.ChatStream(meta)
    chunks = [chunk for event in two_choices() for chunk in stream.chunks(event)]
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role == "assistant"]
    finishes = [
        (c.choices[0].index, c.choices[0].finish_reason)
        for c in chunks
        if c.choices and c.choices[0].finish_reason
    ]
    assert roles == [0, 1]
    assert finishes == [(1, "stop"), (0, "length")]
    assert [c.usage for c in chunks if not c.choices] == [
        render.Usage(prompt_tokens=3, completion_tokens=3, total_tokens=6)
    ]


def test_prompt_list_indexes_choices_by_prompt_and_sums_usage() -> None:
    meta = translate.completion_meta(completion(prompt=["a", "b"], n=2, echo=True), RID, CREATED)
    second = [
        fanout.reindexed(event, 2) if isinstance(event, Delta | ChoiceFinished) else event
        for event in two_choices()
    ]
    answer = render.text_completion(meta, [two_choices(), two_choices()])
    assert [choice.index for choice in answer.choices] == [0, 1, 2, 3]
    assert answer.usage.prompt_tokens == 6 and answer.usage.completion_tokens == 6
    assert [event.index for event in second if isinstance(event, Delta)] == [2, 3, 2]


def test_streamed_prompt_list_ends_with_one_usage_after_every_prompt() -> None:
    request = completion(prompt=["a", "b"], stream=True, stream_options={"include_usage": True}, echo=True)
    stream = render.CompletionStream(translate.completion_meta(request, RID, CREATED))
    events: list[TokenEvent] = [
        Accepted(prompt_tokens=1, worker_id="w", prompt_text="a"),
        Accepted(prompt_tokens=1, worker_id="w", prompt_text="b"),
        Delta(text="x", token_ids=[1], index=1),
        ChoiceFinished(index=1, finish_reason=FinishReason.STOP, completion_tokens=1),
        Finished(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=1, completion_tokens=1)),
        ChoiceFinished(index=0, finish_reason=FinishReason.STOP, completion_tokens=0),
        Finished(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=1, completion_tokens=0)),
    ]
    chunks = [chunk for event in events for chunk in stream.chunks(event)]
    texts = [(c.choices[0].index, c.choices[0].text) for c in chunks if c.choices and c.choices[0].text]
    assert texts == [(0, "a"), (1, "b"), (1, "x")]
    assert [c.usage for c in chunks if not c.choices] == [
        render.Usage(prompt_tokens=2, completion_tokens=1, total_tokens=3)
    ]
