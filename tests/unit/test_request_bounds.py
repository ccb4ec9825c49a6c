"""Every field a client sends is bounded: past a bound the request gets one 400 naming the field.

Each request model (OpenAI chat and completions, TGI, Responses, batch lines) is
validated as the gateway validates it, and ``validation_error`` turns the failure
into what the client reads: a message and the ``param``. Property tests (hypothesis)
check the validators never fail any other way than a validation error naming the field.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from gateway.batches.input_check import FileCheck, InvalidBatchFile
from gateway.batches.lines import LineRules
from gateway.http.errors import validation_error
from gateway.openai import translate
from gateway.openai.limits import (
    MAX_BEAMS,
    MAX_CONTENT_PARTS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_MESSAGES,
    MAX_PROMPT_TOKENS,
    MAX_PROMPTS,
    MAX_STOP_CHARS,
    MAX_TOKEN_COUNT,
    MAX_TOKEN_ID,
)
from gateway.openai.schema import ChatCompletionRequest, CompletionRequest
from gateway.responses_api.schema import ResponseCreateRequest
from gateway.responses_api.translate import response_job
from gateway.tgi.schema import GenerateRequest
from shared.protocol import ChatMessage

HI = {"role": "user", "content": "Hi"}
NON_FINITE = [math.nan, math.inf, -math.inf]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [HI], **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "Once", **fields}


def tgi(**parameters: Any) -> dict[str, Any]:
    return {"inputs": "Once", "parameters": parameters}


def responses(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Hi", **fields}


def refusal(model: type[BaseModel], body: dict[str, Any]) -> tuple[str | None, str]:
    """The ``param`` and message a client gets for ``body``, through the gateway's one mapping."""
    with pytest.raises(ValidationError) as raised:
        model.model_validate(body)
    errors = [{**error, "loc": ("body", *error["loc"])} for error in raised.value.errors()]
    error = validation_error(errors)
    assert error.status == 400
    return error.param, error.message


LONG_STOP = "x" * (MAX_STOP_CHARS + 1)
LAST_ID = str(MAX_TOKEN_ID)
TOO_MANY_PARTS = MAX_CONTENT_PARTS + 1
TOKENS = [7] * (MAX_PROMPT_TOKENS + 1)
BEYOND = {
    "stop string too long": (ChatCompletionRequest, chat(stop=LONG_STOP), "stop", r"at most 512 characters"),
    "stop in a list too long": (CompletionRequest, completion(stop=["a", LONG_STOP]), "stop", r"512"),
    "too many stops": (CompletionRequest, completion(stop=list("abcde")), "stop", r"At most 4"),
    "num_beams": (ChatCompletionRequest, chat(num_beams=MAX_BEAMS + 1), "num_beams", r"equal to 32"),
    "n": (CompletionRequest, completion(n=129), "n", r"less than or equal to 128"),
    "best_of": (CompletionRequest, completion(best_of=129), "best_of", r"less than or equal to 128"),
    "top_logprobs": (ChatCompletionRequest, chat(top_logprobs=21), "top_logprobs", r"equal to 20"),
    "completion logprobs": (CompletionRequest, completion(logprobs=21), "logprobs", r"equal to 20"),
    "logit_bias superscript digit": (ChatCompletionRequest, chat(logit_bias={"²": 1}), "logit_bias", r"'²'"),
    "logit_bias key past int32": (
        ChatCompletionRequest, chat(logit_bias={str(MAX_TOKEN_ID + 1): 1}), "logit_bias", r"token ids"
    ),
    "logit_bias value": (CompletionRequest, completion(logit_bias={"5": -101}), "logit_bias", r"-100, 100"),
    "logit_bias NaN value": (CompletionRequest, completion(logit_bias={"5": math.nan}), "logit_bias", r"100"),
    "logit_bias entries": (
        ChatCompletionRequest,
        chat(logit_bias={str(token): 1 for token in range(MAX_LOGIT_BIAS_ENTRIES + 1)}),
        "logit_bias",
        r"at most 1024",
    ),
    "prompts": (CompletionRequest, completion(prompt=["a"] * (MAX_PROMPTS + 1)), "prompt", r"At most 64"),
    "token-id lists": (CompletionRequest, completion(prompt=[[1]] * (MAX_PROMPTS + 1)), "prompt", r"64"),
    "tokens in a prompt": (CompletionRequest, completion(prompt=TOKENS), "prompt", r"At most 1048576"),
    "tokens in a listed prompt": (CompletionRequest, completion(prompt=[[1], TOKENS]), "prompt", r"1048576"),
    "token id past int32": (CompletionRequest, completion(prompt=[1, MAX_TOKEN_ID + 1]), "prompt", r"0 to"),
    "messages": (ChatCompletionRequest, chat(messages=[HI] * (MAX_MESSAGES + 1)), "messages", r"2048"),
    "content parts": (
        ChatCompletionRequest,
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": ""}] * TOO_MANY_PARTS}]),
        "messages.0.content",
        r"At most 2048 content parts",
    ),
    "max_tokens": (ChatCompletionRequest, chat(max_tokens=MAX_TOKEN_COUNT + 1), "max_tokens", r"less than"),
    "min_tokens": (CompletionRequest, completion(min_tokens=MAX_TOKEN_COUNT + 1), "min_tokens", r"less than"),
    "tgi stop too long": (GenerateRequest, tgi(stop=[LONG_STOP]), "parameters.stop", r"512 characters"),
    "tgi max_new_tokens": (
        GenerateRequest, tgi(max_new_tokens=MAX_TOKEN_COUNT + 1), "parameters.max_new_tokens", r"less than"
    ),
    "responses messages": (
        ResponseCreateRequest, responses(input=[HI] * (MAX_MESSAGES + 1)), "input", r"At most 2048 input"
    ),
    "responses content parts": (
        ResponseCreateRequest,
        responses(input=[{"role": "user", "content": [{"type": "input_text", "text": ""}] * TOO_MANY_PARTS}]),
        "input.0.content",
        r"At most 2048 content parts",
    ),
    "responses bad part": (
        ResponseCreateRequest,
        responses(input=[{"role": "user", "content": [{"type": "image", "text": "a"}]}]),
        "input.0.content.0.type",
        r"input_text",
    ),
    "responses input of another type": (ResponseCreateRequest, responses(input=5), "input", r"string or"),
    "responses metadata pairs": (
        ResponseCreateRequest, responses(metadata={str(key): "v" for key in range(17)}), "metadata", r"16"
    ),
    "responses metadata key": (ResponseCreateRequest, responses(metadata={"k" * 65: "v"}), "metadata", r"64"),
    "responses metadata value": (
        ResponseCreateRequest, responses(metadata={"k": "v" * 513}), "metadata.k", r"512"
    ),
    "responses max_output_tokens": (
        ResponseCreateRequest, responses(max_output_tokens=MAX_TOKEN_COUNT + 1), "max_output_tokens", r"less"
    ),
}  # fmt: skip


@pytest.mark.parametrize(("model", "body", "param", "message"), BEYOND.values(), ids=BEYOND.keys())
def test_a_value_past_its_bound_is_refused_naming_the_field(
    model: type[BaseModel], body: dict[str, Any], param: str, message: str
) -> None:
    refused_param, refused_message = refusal(model, body)

    assert refused_param == param
    assert re.search(message, refused_message), refused_message


AT_THE_BOUND = {
    "longest stop": (ChatCompletionRequest, chat(stop="x" * MAX_STOP_CHARS)),
    "widest beam": (ChatCompletionRequest, chat(num_beams=MAX_BEAMS)),
    "logit_bias at its limits": (
        ChatCompletionRequest,
        chat(logit_bias={str(token): -100 for token in range(MAX_LOGIT_BIAS_ENTRIES - 1)} | {LAST_ID: 100}),
    ),
    "most prompts": (CompletionRequest, completion(prompt=["a"] * MAX_PROMPTS)),
    "most messages": (ChatCompletionRequest, chat(messages=[HI] * MAX_MESSAGES)),
    "tgi longest stop": (GenerateRequest, tgi(stop=["x" * MAX_STOP_CHARS])),
    "responses most messages": (ResponseCreateRequest, responses(input=[HI] * MAX_MESSAGES)),
    "responses full metadata": (
        ResponseCreateRequest, responses(metadata={f"{key:064d}": "v" * 512 for key in range(16)})
    ),
}  # fmt: skip


@pytest.mark.parametrize(("model", "body"), AT_THE_BOUND.values(), ids=AT_THE_BOUND.keys())
def test_a_value_at_its_bound_is_accepted(model: type[BaseModel], body: dict[str, Any]) -> None:
    model.model_validate(body)


def test_logit_bias_keys_reach_the_job_as_token_ids() -> None:
    request = ChatCompletionRequest.model_validate(chat(logit_bias={"0": -100, "2147483647": 5.5}))

    assert translate.chat_job(request, "r" * 32, 0.0).sampling.logit_bias == {0: -100, 2147483647: 5.5}


def test_responses_string_input_is_one_user_message() -> None:
    job = response_job(ResponseCreateRequest.model_validate(responses(input="Hello")), "r" * 32, 0.0)

    assert job.prompt.kind == "chat"
    assert job.prompt.messages == [ChatMessage(role="user", content="Hello")]


def test_a_batch_line_gets_the_same_bounds_as_an_interactive_request() -> None:
    bad = [
        {"logit_bias": {"²": 1}},
        {"repetition_penalty": math.inf},
        {"num_beams": MAX_BEAMS + 1},
        {"stop": LONG_STOP},
    ]
    lines = [
        json.dumps(
            {
                "custom_id": str(number),
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": chat(**fields),
            }
        ).encode()
        for number, fields in enumerate(bad)
    ]

    check = FileCheck(LineRules("/v1/chat/completions", max_n=16, max_tokens_limit=None))
    check.feed(b"\n".join(lines), 0)
    with pytest.raises(InvalidBatchFile) as raised:
        check.finish()

    refused = [(error.line, error.param) for error in raised.value.errors]
    # A line names the field inside its body.
    assert refused == [
        (1, "body.logit_bias"),
        (2, "body.repetition_penalty"),
        (3, "body.num_beams"),
        (4, "body.stop"),
    ]


# Every float is finite, on every route.


def _float_fields(model: type[BaseModel]) -> list[str]:
    return sorted(name for name, field in model.model_fields.items() if "float" in str(field.annotation))


FLOAT_FIELDS = [
    *((ChatCompletionRequest, chat, name) for name in _float_fields(ChatCompletionRequest)),
    *((CompletionRequest, completion, name) for name in _float_fields(CompletionRequest)),
    *((ResponseCreateRequest, responses, name) for name in _float_fields(ResponseCreateRequest)),
]


def test_the_float_fields_are_the_ones_we_expect() -> None:
    # A guard on the property below: it would pass vacuously if no field were found.
    names = {name for _, _, name in FLOAT_FIELDS}
    assert {"repetition_penalty", "length_penalty", "temperature", "top_p", "frequency_penalty"} <= names


@given(field=st.sampled_from(FLOAT_FIELDS), value=st.sampled_from(NON_FINITE))
def test_no_float_field_accepts_a_non_finite_value(field: tuple[Any, Any, str], value: float) -> None:
    model, body, name = field

    param, _ = refusal(model, body(**{name: value}))

    assert param == name


def test_non_finite_numbers_in_json_are_refused_as_the_gateway_reads_them() -> None:
    # The gateway parses with json.loads, which reads NaN, Infinity and 1e999.
    for raw in ("NaN", "Infinity", "-Infinity", "1e999"):
        body = json.loads(f'{{"model": "m", "prompt": "x", "length_penalty": {raw}}}')
        assert refusal(CompletionRequest, body)[0] == "length_penalty"


@given(parameter=st.sampled_from(["temperature", "repetition_penalty", "frequency_penalty", "top_p"]))
def test_tgi_refuses_non_finite_floats_too(parameter: str) -> None:
    for value in NON_FINITE:
        assert refusal(GenerateRequest, tgi(**{parameter: value}))[0] == f"parameters.{parameter}"


# The validators fail only with a validation error naming their field.

_keys = st.one_of(st.text(max_size=12), st.integers(min_value=-5, max_value=2**40).map(str))
_biases = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-1000, 1000))


@given(st.dictionaries(_keys, _biases, max_size=6))
def test_any_logit_bias_is_token_ids_within_range_or_a_refusal(biases: dict[str, float]) -> None:
    try:
        request = ChatCompletionRequest.model_validate(chat(logit_bias=biases))
    except ValidationError as error:
        assert [part["loc"] for part in error.errors()] == [("logit_bias",)]
        return
    sampling = translate.chat_job(request, "r" * 32, 0.0).sampling
    assert sampling.logit_bias is None or all(
        0 <= token <= MAX_TOKEN_ID and -100 <= bias <= 100 for token, bias in sampling.logit_bias.items()
    )


_stop_texts = st.text(min_size=0, max_size=MAX_STOP_CHARS + 2)


@given(st.one_of(st.none(), _stop_texts, st.lists(_stop_texts, max_size=6)))
def test_any_stop_is_a_few_short_strings_or_a_refusal(stop: str | list[str] | None) -> None:
    try:
        request = CompletionRequest.model_validate(completion(stop=stop))
    except ValidationError as error:
        assert error.errors()[0]["loc"] == ("stop",)
        return
    sequences = [request.stop] if isinstance(request.stop, str) else request.stop or []
    assert len(sequences) <= 4
    assert all(0 < len(sequence) <= MAX_STOP_CHARS for sequence in sequences)


_prompt_atoms = st.one_of(
    st.text(max_size=3), st.integers(min_value=-3, max_value=2**33), st.booleans(), st.none(), st.floats()
)
_prompts = st.recursive(_prompt_atoms, lambda inner: st.lists(inner, max_size=5), max_leaves=20)


@given(_prompts)
def test_any_prompt_is_bounded_prompts_or_a_refusal(prompt: Any) -> None:
    try:
        request = CompletionRequest.model_validate(completion(prompt=prompt))
    except ValidationError as error:
        assert error.errors()[0]["loc"][0] == "prompt"
        return
    assert 1 <= len(request.prompt) <= MAX_PROMPTS
    for single in request.prompt:
        assert isinstance(single, str) or all(0 <= token <= MAX_TOKEN_ID for token in single)
