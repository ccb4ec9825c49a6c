"""Which jobs a worker prepares on its event loop: short plain prompts, not grammars, tools or long ones."""

from __future__ import annotations

from shared.protocol import (
    ChatMessage,
    ChatPrompt,
    FunctionTool,
    GenerationJob,
    JsonConstraint,
    Prompt,
    SamplingSpec,
    TextPrompt,
    TokenPrompt,
)
from worker.driver.lifecycle import QUICK_PROMPT_CHARS, prepares_quickly


def _job(prompt: Prompt, **fields: object) -> GenerationJob:
    return GenerationJob.model_validate(
        {"request_id": "r", "model": "m", "prompt": prompt, "sampling": SamplingSpec(), "created_at": 1.0}
        | fields
    )


def _chat(*contents: str, tools: list[FunctionTool] | None = None) -> ChatPrompt:
    return ChatPrompt(messages=[ChatMessage(role="user", content=text) for text in contents], tools=tools)


def test_short_plain_prompts_are_prepared_on_the_loop() -> None:
    assert prepares_quickly(_job(_chat("Hi", "How are you?")))
    assert prepares_quickly(_job(TextPrompt(text="Once upon a time")))
    assert prepares_quickly(_job(TokenPrompt(token_ids=[1] * QUICK_PROMPT_CHARS)))


def test_long_prompts_grammars_and_tools_go_to_a_thread() -> None:
    half = "x" * (QUICK_PROMPT_CHARS // 2 + 1)
    assert not prepares_quickly(_job(_chat(half, half)))  # long only together
    assert not prepares_quickly(_job(TextPrompt(text=half * 2)))
    assert not prepares_quickly(_job(TokenPrompt(token_ids=[1] * (QUICK_PROMPT_CHARS + 1))))
    assert not prepares_quickly(_job(_chat("Hi"), constraint=JsonConstraint()))
    assert not prepares_quickly(_job(_chat("Hi", tools=[FunctionTool(name="f")])))
    assert not prepares_quickly(_job(_chat("Hi"), tool_choice={"mode": "auto"}))
