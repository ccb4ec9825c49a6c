"""The official clients against real gateway and worker processes: openai's SDK and huggingface_hub's.

What a user of either library sees: answers, streams, model listings and the
library's own exception classes for bad input. The fake engine generates its
script greedily, so every answer is known exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import huggingface_hub.constants
import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError as HfValidationError

from shared.redis_server import EmbeddedRedis
from shared.settings import WorkerSettings
from tests.live_stack import served_stack

MODEL = "conformance-model"
SCRIPT = WorkerSettings.model_fields["fake_script"].default
SCRIPT_TOKENS = len(SCRIPT.encode())  # byte-level fake tokenizer; EOS comes after the script
MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    # A Redis of its own: TGI routes need the model named once several are live, and the
    # session's Redis also has other tests' workers (the e2e real-model one, for instance).
    with EmbeddedRedis() as private_redis, served_stack(private_redis.url, MODEL) as url:
        yield url


@pytest.fixture
def sdk(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture
def hf(base_url: str, monkeypatch: pytest.MonkeyPatch) -> InferenceClient:
    # `make test` sets HF_HUB_OFFLINE=1 so nothing reaches the Hub; huggingface_hub then refuses
    # every URL, our loopback gateway included. This client talks to nothing but that gateway.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return InferenceClient(base_url=base_url, api_key="unused", timeout=30)


# openai


def test_openai_chat_completion(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]

    assert completion.choices[0].message.content == SCRIPT
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens == SCRIPT_TOKENS + 1


def test_openai_chat_completion_streamed(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == SCRIPT
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == SCRIPT_TOKENS + 1


def test_openai_completion(sdk: openai.OpenAI) -> None:
    completion = sdk.completions.create(model=MODEL, prompt="Once", max_tokens=9)

    assert (completion.choices[0].text, completion.choices[0].finish_reason) == (SCRIPT[:9], "length")


def test_openai_completion_streamed(sdk: openai.OpenAI) -> None:
    chunks = list(sdk.completions.create(model=MODEL, prompt="Once", max_tokens=9, stream=True))

    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == SCRIPT[:9]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_openai_models_list_and_retrieve(sdk: openai.OpenAI) -> None:
    listed = [model.id for model in sdk.models.list()]
    model = sdk.models.retrieve(MODEL)

    assert MODEL in listed
    assert (model.id, model.object) == (MODEL, "model")


def test_openai_sdk_raises_bad_request_naming_the_parameter(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)  # type: ignore[arg-type]

    assert (caught.value.status_code, caught.value.param) == (400, "temperature")
    assert "temperature" in caught.value.message


def test_openai_sdk_raises_context_length_exceeded(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model=MODEL, prompt="x" * 300)

    assert caught.value.code == "context_length_exceeded"


def test_openai_sdk_raises_not_found_for_an_unknown_model(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="nobody/serves-this", messages=MESSAGES)  # type: ignore[arg-type]

    assert (caught.value.code, caught.value.param) == ("model_not_found", "model")


# huggingface_hub


def test_hf_chat_completion(hf: InferenceClient) -> None:
    output = hf.chat_completion(MESSAGES, model=MODEL)

    assert output.choices[0].message.content == SCRIPT
    assert output.choices[0].finish_reason == "stop"


def test_hf_chat_completion_streamed(hf: InferenceClient) -> None:
    chunks = list(hf.chat_completion(MESSAGES, model=MODEL, stream=True))

    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == SCRIPT
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_hf_text_generation(hf: InferenceClient) -> None:
    assert hf.text_generation("Once", max_new_tokens=9) == SCRIPT[:9]


def test_hf_text_generation_with_details(hf: InferenceClient) -> None:
    output = hf.text_generation("Once", details=True, seed=3, stop=["fox"])

    assert output.generated_text == "The quick brown "
    assert output.details is not None
    assert (output.details.finish_reason, output.details.seed) == ("stop_sequence", 3)
    assert "".join(token.text for token in output.details.tokens) == "The quick brown "
    assert all(isinstance(token.logprob, float) for token in output.details.tokens)


def test_hf_text_generation_streamed(hf: InferenceClient) -> None:
    tokens = list(hf.text_generation("Once", max_new_tokens=12, stream=True))

    assert "".join(tokens) == SCRIPT[:12]


def test_hf_text_generation_streamed_with_details(hf: InferenceClient) -> None:
    events = list(hf.text_generation("Once", stream=True, details=True))

    assert "".join(event.token.text for event in events) == SCRIPT
    assert [event.index for event in events] == list(range(1, len(events) + 1))
    assert all(event.details is None and event.generated_text is None for event in events[:-1])
    last = events[-1]
    assert last.generated_text == SCRIPT
    assert last.details is not None
    assert (last.details.finish_reason, last.details.generated_tokens) == ("eos_token", SCRIPT_TOKENS + 1)
    assert last.details.input_length == len(b"Once")


def test_hf_text_generation_bad_input_raises_the_validation_error(hf: InferenceClient) -> None:
    with pytest.raises(HfValidationError, match="temperature"):
        hf.text_generation("Once", temperature=0.0)
    with pytest.raises(HfValidationError, match="maximum context length is 256 tokens"):
        hf.text_generation("Once", max_new_tokens=1000)


def test_hf_text_generation_takes_a_grammar_and_refuses_one_that_cannot_be_enforced(
    hf: InferenceClient,
) -> None:
    # The fake engine does not shape its script; whether the output matches is the e2e test's.
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    assert hf.text_generation("Once", max_new_tokens=4, grammar={"type": "json", "value": schema})
    assert hf.text_generation("Once", max_new_tokens=4, grammar={"type": "regex", "value": "[a-z]+"})
    with pytest.raises(HfValidationError, match="grammar"):
        hf.text_generation("Once", grammar={"type": "regex", "value": "(unclosed"})
    with pytest.raises(HfValidationError, match="grammar"):
        hf.text_generation("Once", grammar={"type": "json", "value": {"type": "no-such-type"}})
