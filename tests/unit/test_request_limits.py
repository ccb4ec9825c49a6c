"""Preparation refuses, as a 400 naming the field, everything the engine could not take."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import ContextLengthExceeded, InvalidRequest
from shared.protocol import (
    ChatMessage,
    ChatPrompt,
    GenerationJob,
    Prompt,
    SamplingSpec,
    TextPrompt,
    TokenPrompt,
)
from worker.engine.fake import EOS_TOKEN_ID, FAKE_VOCAB_SIZE, ByteTokenizer
from worker.engine.sampling import build_processors, choose_token, make_generator
from worker.requests.limits import ModelLimits
from worker.requests.params import MIN_TEMPERATURE, DefaultLayers
from worker.requests.preparation import PreparedRequest, prepare

LIMITS = ModelLimits(
    max_model_len=100, eos_token_ids=frozenset({EOS_TOKEN_ID}), vocab_size=FAKE_VOCAB_SIZE, max_num_beams=4
)
NO_DEFAULTS = DefaultLayers(SamplingSpec(), SamplingSpec())


def _prepare(prompt: Prompt | None = None, limits: ModelLimits = LIMITS, **job: Any) -> PreparedRequest:
    generation = GenerationJob(
        request_id="r", model="m", prompt=prompt or TextPrompt(text="Hi"), created_at=0.0, **job
    )
    return prepare(generation, ByteTokenizer(), NO_DEFAULTS, limits)


def _refused(prompt: Prompt | None = None, limits: ModelLimits = LIMITS, **job: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as raised:
        _prepare(prompt, limits, **job)
    return raised.value


@pytest.mark.parametrize("bad_id", [FAKE_VOCAB_SIZE, 10**12, -1])
def test_a_token_id_outside_the_vocabulary_is_refused_naming_the_prompt(bad_id: int) -> None:
    refused = _refused(TokenPrompt(token_ids=[72, bad_id, 105]))
    assert (refused.status, refused.param) == (400, "prompt")
    assert f"Token id {bad_id} is outside the model's vocabulary" in refused.message


def test_every_id_of_the_vocabulary_is_accepted_eos_included() -> None:
    prepared = _prepare(TokenPrompt(token_ids=[0, 255, EOS_TOKEN_ID]))
    assert prepared.engine_request.prompt_token_ids == (0, 255, EOS_TOKEN_ID)


def test_a_chat_prompt_tokenized_past_the_vocabulary_names_the_messages() -> None:
    # A tokenizer may know ids the model lacks (added tokens): a 100-id vocabulary stands in for that.
    small = ModelLimits(100, frozenset(), vocab_size=100, max_num_beams=4)
    chat = ChatPrompt(messages=[ChatMessage(role="user", content="~~~")])  # "~" is byte 126
    assert _refused(chat, small).param == "messages"


def test_num_beams_above_the_servers_bound_is_refused_and_at_it_accepted() -> None:
    refused = _refused(sampling=SamplingSpec(num_beams=1_000_000))
    assert (refused.param, refused.message) == (
        "num_beams",
        "num_beams must be between 1 and 4 on this server",
    )
    assert _prepare(sampling=SamplingSpec(num_beams=4)).engine_request.sampling.num_beams == 4


def test_more_alternatives_than_the_vocabulary_holds_are_refused() -> None:
    tiny = ModelLimits(100, frozenset(), vocab_size=10, max_num_beams=4)
    assert _refused(TokenPrompt(token_ids=[1, 2]), tiny, logprobs=11).param == "logprobs"
    assert _refused(TokenPrompt(token_ids=[1, 2]), tiny, prompt_logprobs=11).param == "logprobs"
    assert _prepare(TokenPrompt(token_ids=[1, 2]), tiny, logprobs=10).engine_request.logprobs == 10


BAD_SPECS = {
    "NaN temperature": (SamplingSpec(temperature=math.nan), "temperature"),
    "infinite top_p": (SamplingSpec(top_p=math.inf), "top_p"),
    "min_p above 1": (SamplingSpec(min_p=1.5), "min_p"),
    "presence_penalty above 2": (SamplingSpec(presence_penalty=3.0), "presence_penalty"),
    "frequency_penalty -inf": (SamplingSpec(frequency_penalty=-math.inf), "frequency_penalty"),
    "NaN length_penalty": (SamplingSpec(length_penalty=math.nan), "length_penalty"),
    "infinite repetition_penalty": (SamplingSpec(repetition_penalty=math.inf), "repetition_penalty"),
    "repetition_penalty that is 0 in float32": (SamplingSpec(repetition_penalty=1e-40), "repetition_penalty"),
    "negative no_repeat_ngram_size": (SamplingSpec(no_repeat_ngram_size=-1), "no_repeat_ngram_size"),
    "negative min_tokens": (SamplingSpec(min_tokens=-1), "min_tokens"),
    "min_tokens above max_tokens": (SamplingSpec(max_tokens=5, min_tokens=6), "min_tokens"),
    "min_tokens too large for a float": (SamplingSpec(min_tokens=10**400), "min_tokens"),
    "zero max_tokens": (SamplingSpec(max_tokens=0), "max_tokens"),
    "seed past 64 bits": (SamplingSpec(seed=2**64), "seed"),
    "logit_bias beyond 100": (SamplingSpec(logit_bias={5: 1e9}), "logit_bias"),
    "NaN logit_bias": (SamplingSpec(logit_bias={5: math.nan}), "logit_bias"),
    "logit_bias id past the vocabulary": (SamplingSpec(logit_bias={FAKE_VOCAB_SIZE: 1.0}), "logit_bias"),
    "zero num_beams": (SamplingSpec(num_beams=0), "num_beams"),
}


@pytest.mark.parametrize(("spec", "param"), BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_a_parameter_the_engine_cannot_take_is_refused_naming_it(spec: SamplingSpec, param: str) -> None:
    refused = _refused(sampling=spec)
    assert (refused.status, refused.type, refused.param) == (400, "invalid_request_error", param)


def test_a_tiny_positive_temperature_samples_at_the_floor_instead_of_overflowing() -> None:
    sampling = _prepare(sampling=SamplingSpec(temperature=1e-300)).engine_request.sampling
    assert sampling.temperature == MIN_TEMPERATURE
    assert _prepare(sampling=SamplingSpec(temperature=0.0)).engine_request.sampling.is_greedy


floats = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-3, 3)
SPECS = st.builds(
    SamplingSpec,
    max_tokens=st.none() | st.integers(-2, 120),
    temperature=st.none() | floats,
    top_p=st.none() | floats,
    top_k=st.none() | st.integers(-5, 10**6),
    typical_p=st.none() | floats,
    min_p=st.none() | floats,
    repetition_penalty=st.none() | floats | st.floats(1e-45, 1e-30),
    presence_penalty=st.none() | floats,
    frequency_penalty=st.none() | floats,
    no_repeat_ngram_size=st.none() | st.integers(-3, 4),
    min_tokens=st.none() | st.integers(-3, 120),
    seed=st.none() | st.integers(-(2**65), 2**65),
    logit_bias=st.none() | st.dictionaries(st.integers(-5, FAKE_VOCAB_SIZE + 5), floats, max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(spec=SPECS, logits=st.lists(st.floats(-30, 30), min_size=FAKE_VOCAB_SIZE, max_size=FAKE_VOCAB_SIZE))
def test_whatever_preparation_accepts_the_sampling_stack_can_run(
    spec: SamplingSpec, logits: list[float]
) -> None:
    try:
        prepared = _prepare(TokenPrompt(token_ids=[1, 2, 3, 2]), sampling=spec)
    except (InvalidRequest, ContextLengthExceeded):
        return
    request = prepared.engine_request
    params = request.sampling
    processors = build_processors(params, len(request.prompt_token_ids), request.eos_token_ids)
    history = torch.LongTensor([list(request.prompt_token_ids)])
    generator = make_generator(params, torch.device("cpu"))
    token = choose_token(torch.tensor([logits]), history, processors, generator)
    assert 0 <= token < FAKE_VOCAB_SIZE
    assert request.max_new_tokens >= 1 and params.min_new_tokens >= 0
