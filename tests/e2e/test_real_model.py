"""End to end with the real SmolLM2-135M-Instruct, through real processes, via the official SDK."""

from __future__ import annotations

import os
import subprocess
import sys

import openai
import pytest

# Generous: these run the real model on 2 busy cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_streamed_chat_answer_names_paris(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(model=model, messages=QUESTION, stream=True, max_tokens=40)  # type: ignore[arg-type]
    chunks = list(stream)
    answer = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert "Paris" in answer
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_greedy_output_is_identical_across_calls(client: openai.OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    answers = [
        client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=30)  # type: ignore[arg-type]
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert answers[0] and answers[0] == answers[1]


def test_max_tokens_gives_exactly_that_many_tokens(client: openai.OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    completion = client.chat.completions.create(model=model, messages=messages, max_tokens=5)  # type: ignore[arg-type]
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert completion.choices[0].finish_reason == "length"


def test_stop_sequence_is_trimmed_from_the_stream(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(model=model, messages=QUESTION, stream=True, stop=["Paris"])  # type: ignore[arg-type]
    chunks = list(stream)
    answer = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert answer.startswith("The capital of France is")
    assert "Paris" not in answer
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_text_completion_with_echo_and_usage(client: openai.OpenAI, model: str) -> None:
    completion = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=4, echo=True
    )
    assert completion.choices[0].text.startswith("The capital of France is")
    assert completion.usage is not None and completion.usage.completion_tokens == 4


def test_ignore_eos_generates_to_max_tokens(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=24,
        extra_body={"ignore_eos": True},  # type: ignore[arg-type]
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 24


def test_context_window_overflow_is_a_400_before_streaming(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=QUESTION, stream=True, max_tokens=10_000)  # type: ignore[arg-type]
    assert raised.value.code == "context_length_exceeded"


def test_models_lists_the_bundled_model(client: openai.OpenAI, model: str) -> None:
    assert [entry.id for entry in client.models.list().data] == [model]


def test_cli_complete_prints_a_streamed_answer(gateway_url: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "complete",
            "The capital of France is",
            "--base-url",
            f"{gateway_url}/v1",
            "--max-tokens",
            "8",
            "--show-usage",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "8 completion" in result.stderr


def test_cli_chat_answers_a_question_from_stdin(gateway_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "chat", "--base-url", f"{gateway_url}/v1", "--max-tokens", "20"],
        input="What is the capital of France?\n/exit\n",
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
