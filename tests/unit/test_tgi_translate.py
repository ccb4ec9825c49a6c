"""TGI requests become the jobs TGI's sampling rules imply; events become TGI's exact answers and streams."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.tgi import translate
from gateway.tgi.schema import CompatGenerateRequest, GenerateRequest
from shared.errors import ContextLengthExceeded, Overloaded, WorkerFailed
from shared.protocol import (
    Accepted,
    Delta,
    Finished,
    FinishReason,
    SamplingSpec,
    TextPrompt,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from shared.registry import WorkerInfo

REQUEST_ID = "0123456789abcdef0123456789abcdef"


def request(**parameters: Any) -> GenerateRequest:
    return GenerateRequest.model_validate({"inputs": "Once upon", "parameters": parameters})


def events(
    *texts: str, reason: FinishReason = FinishReason.STOP, stop: str | None = None
) -> list[TokenEvent]:
    deltas = [Delta(text=text, token_ids=[10 + index]) for index, text in enumerate(texts)]
    usage = Usage(prompt_tokens=4, completion_tokens=len(texts) + 1)
    finished = Finished(finish_reason=reason, usage=usage, stop_sequence=stop)
    return [Accepted(prompt_tokens=4, worker_id="w1"), *deltas, finished]


def stream(body: GenerateRequest, items: list[TokenEvent]) -> list[dict[str, Any]]:
    folder = translate.TgiStream(body)
    return [response.model_dump() for event in items for response in folder.feed(event)]


# Requests -> jobs


def test_parameters_present_without_sampling_hints_decode_greedily() -> None:
    job = translate.generate_job(request(max_new_tokens=5, stop=["\n"]), "m", REQUEST_ID, 1.0, stream=False)

    assert job.prompt == TextPrompt(text="Once upon")
    assert job.sampling == SamplingSpec(max_tokens=5, temperature=0.0, stop=["\n"])
    assert job.logprobs is None


def test_parameters_absent_sample_at_temperature_one_like_tgi() -> None:
    body = GenerateRequest.model_validate({"inputs": "Hi"})

    assert translate.generate_job(body, "m", REQUEST_ID, 1.0, stream=False).sampling == SamplingSpec(
        temperature=1.0
    )


@pytest.mark.parametrize("hint", [{"top_k": 5}, {"top_p": 0.9}, {"typical_p": 0.5}, {"do_sample": True}])
def test_any_warper_turns_sampling_on(hint: dict[str, Any]) -> None:
    assert translate.sampling(request(**hint).parameters or pytest.fail()).temperature == 1.0


def test_streams_and_details_ask_the_worker_for_logprobs() -> None:
    assert translate.generate_job(request(), "m", REQUEST_ID, 1.0, stream=True).logprobs == 0
    assert translate.generate_job(request(details=True), "m", REQUEST_ID, 1.0, stream=False).logprobs == 0
    assert translate.generate_job(request(top_n_tokens=3), "m", REQUEST_ID, 1.0, stream=True).logprobs == 3


@pytest.mark.parametrize(
    ("parameters", "location"),
    [
        ({"temperature": 0}, "temperature"),
        ({"top_p": 1.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"truncate": 10}, "truncate"),
        ({"watermark": True}, "watermark"),
        ({"decoder_input_details": True}, "decoder_input_details"),
        ({"best_of": 2}, "best_of"),
        ({"top_n_tokens": 6}, "top_n_tokens"),
        ({"seed": -1}, "seed"),
    ],
)
def test_values_tgi_refuses_or_we_do_not_support_are_refused(
    parameters: dict[str, Any], location: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        request(**parameters)

    assert caught.value.errors()[0]["loc"] == ("parameters", location)


def test_empty_inputs_are_refused() -> None:
    with pytest.raises(ValidationError, match="inputs"):
        GenerateRequest.model_validate({"inputs": ""})


# Events -> answers


def test_plain_answer_is_just_the_text() -> None:
    response = translate.generate_response(request(), events("Hel", "lo"))

    assert response.model_dump() == {"generated_text": "Hello"}


def test_details_list_tokens_finish_reason_and_seed() -> None:
    body = request(details=True, seed=7, return_full_text=True)

    response = translate.generate_response(body, events("Hel", "lo", stop="!", reason=FinishReason.STOP))

    assert response.model_dump() == {
        "generated_text": "Once uponHello",
        "details": {
            "finish_reason": "stop_sequence",
            "generated_tokens": 3,
            "seed": 7,
            "prefill": [],
            "tokens": [
                {"id": 10, "text": "Hel", "logprob": None, "special": False},
                {"id": 11, "text": "lo", "logprob": None, "special": False},
            ],
        },
    }


@pytest.mark.parametrize(
    ("reason", "stop", "expected"),
    [
        (FinishReason.LENGTH, None, "length"),
        (FinishReason.STOP, None, "eos_token"),
        (FinishReason.STOP, "x", "stop_sequence"),
    ],
)
def test_finish_reasons_use_tgi_names(reason: FinishReason, stop: str | None, expected: str) -> None:
    finished = Finished(
        finish_reason=reason, usage=Usage(prompt_tokens=1, completion_tokens=1), stop_sequence=stop
    )

    assert translate.finish_reason(finished) == expected


def test_a_delta_completing_several_tokens_puts_its_text_on_the_last_with_logprobs() -> None:
    logprobs = [
        TokenLogprob(
            token_id=195, token="\ufffd", logprob=-0.5, top=[TopLogprob(token_id=1, token="a", logprob=-1.0)]
        ),
        TokenLogprob(token_id=169, token="\ufffd", logprob=-0.25, top=[]),
    ]
    delta = Delta(text="é", token_ids=[195, 169], logprobs=logprobs)

    tokens = translate.delta_tokens(delta)

    assert [(token.model_dump(), [alt.id for alt in top]) for token, top in tokens] == [
        ({"id": 195, "text": "", "logprob": -0.5, "special": False}, [1]),
        ({"id": 169, "text": "é", "logprob": -0.25, "special": False}, []),
    ]


# Events -> stream


def test_stream_holds_each_token_back_so_the_last_carries_text_and_details() -> None:
    body = request(details=True)

    frames = stream(body, events("Hel", "lo", reason=FinishReason.LENGTH))

    assert frames == [
        {
            "index": 1,
            "token": {"id": 10, "text": "Hel", "logprob": None, "special": False},
            "generated_text": None,
            "details": None,
        },
        {
            "index": 2,
            "token": {"id": 11, "text": "lo", "logprob": None, "special": False},
            "generated_text": "Hello",
            "details": {"finish_reason": "length", "generated_tokens": 3, "seed": None, "input_length": 4},
        },
    ]


def test_stream_without_details_still_ends_with_the_generated_text() -> None:
    frames = stream(request(), events("Hi"))

    assert frames[-1]["generated_text"] == "Hi"
    assert frames[-1]["details"] is None


def test_stream_of_a_generation_without_text_ends_with_an_empty_special_token() -> None:
    frames = stream(request(details=True), events())

    assert frames == [
        {
            "index": 1,
            "token": {"id": 0, "text": "", "logprob": None, "special": True},
            "generated_text": "",
            "details": {"finish_reason": "eos_token", "generated_tokens": 1, "seed": None, "input_length": 4},
        }
    ]


def test_compat_request_defaults_to_not_streaming() -> None:
    assert CompatGenerateRequest.model_validate({"inputs": "x"}).stream is False


# Workers and errors


def test_info_reports_the_smallest_context_of_the_serving_workers() -> None:
    workers = [
        WorkerInfo(worker_id="a", model="m", max_model_len=2048, started_at=1.0),
        WorkerInfo(worker_id="b", model="m", max_model_len=1024, started_at=2.0),
    ]

    info = translate.info("m", workers, "9.9")

    assert (info.model_id, info.max_input_tokens, info.max_total_tokens, info.version) == (
        "m",
        1023,
        1024,
        "9.9",
    )


def test_errors_use_tgi_statuses_and_types() -> None:
    too_long = translate.tgi_error(ContextLengthExceeded("too long", param="messages"))
    busy = translate.tgi_error(Overloaded("busy"))
    crashed = translate.tgi_error(WorkerFailed("crashed"))

    assert [(status, body.model_dump()) for status, body in (too_long, busy, crashed)] == [
        (422, {"error": "too long", "error_type": "validation"}),
        (429, {"error": "busy", "error_type": "overloaded"}),
        (500, {"error": "crashed", "error_type": "generation"}),
    ]
