"""n choices and logprobs with the real SmolLM2-135M-Instruct, via real processes and the official SDK."""

from __future__ import annotations

import math

import openai
import pytest

# Generous: these run the real model on 2 busy cores.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_greedy_chat_logprobs_have_the_chosen_token_as_top_1(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        temperature=0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,  # type: ignore[arg-type]
    )
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert len(entries) == answer.usage.completion_tokens  # type: ignore[union-attr]
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-4)
        assert entry.logprob <= 0 and math.isfinite(entry.logprob)
    assert "".join(entry.token for entry in entries) == choice.message.content


def test_two_seeded_sampled_choices_are_reproducible(client: openai.OpenAI, model: str) -> None:
    def ask() -> list[str | None]:
        answer = client.chat.completions.create(
            model=model,
            messages=QUESTION,
            n=2,
            temperature=1.0,
            seed=1234,
            max_tokens=12,  # type: ignore[arg-type]
        )
        assert [choice.index for choice in answer.choices] == [0, 1]
        return [choice.message.content for choice in answer.choices]

    first = ask()
    assert first == ask()
    assert all(first)


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI, model: str) -> None:
    answer = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=2, echo=True, logprobs=1, temperature=0
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None and logprobs.tokens is not None
    assert logprobs.token_logprobs[0] is None
    assert all(value is not None and value <= 0 for value in logprobs.token_logprobs[1:])
    assert answer.choices[0].text.startswith("The capital of France is")
