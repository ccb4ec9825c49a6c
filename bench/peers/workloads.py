"""Owns what is sent: the chat levels' forced-length requests and the long-prompt workload.

Chat levels reuse ``make bench``'s short prompts (``bench.prompts``): C clients, N = max(16, 4 C)
requests, 64 forced output tokens each. The long-prompt workload draws, with a fixed seed,
each request's prompt length (300-1,500 tokens as the worker renders it, chat template
included) and output length (32-256 tokens, forced with ``ignore_eos``), and builds the
prompt by appending seeded sentences until the length is reached, counted with the model's
tokenizer. Every long prompt starts differently, so no system's prefix cache holds more
than the chat template's start.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.prompts import chat_messages

PROMPT_TOKENS = (300, 1500)
OUTPUT_TOKENS = (32, 256)
_SUBJECTS = (
    "The harbour master", "A young engineer", "The village council", "An old cartographer",
    "The night nurse", "A travelling musician", "The head gardener", "A retired pilot",
    "The school librarian", "A beekeeper", "The ferry captain", "A glassblower",
)  # fmt: skip
_VERBS = (
    "wrote down", "argued about", "quietly repaired", "measured", "drew a map of",
    "forgot about", "sold", "photographed", "counted", "described",
)  # fmt: skip
_OBJECTS = (
    "the broken lantern", "a crate of oranges", "the northern road", "an unfinished bridge",
    "the tide tables", "a letter from abroad", "the winter stores", "a flock of geese",
    "the bell tower", "a ledger of debts", "the river's new course", "a cracked violin",
)  # fmt: skip
_WHEN = (
    "before dawn", "after the storm", "on market day", "late in the autumn", "during the festival",
    "while the others slept", "in the spring of that year", "just before the ferry left",
)  # fmt: skip
_INSTRUCTION = "Read these notes from a town's logbook, then continue the log in the same style."


@dataclass(frozen=True)
class LongRequest:
    """One request of the long-prompt workload."""

    prompt: str
    prompt_tokens: int  # as the worker renders it: chat template included
    max_tokens: int


def draw_lengths(count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` (prompt tokens, output tokens) pairs, the same for the same seed."""
    rng = random.Random(seed)
    return [(rng.randint(*PROMPT_TOKENS), rng.randint(*OUTPUT_TOKENS)) for _ in range(count)]


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_WHEN)}."


def build_prompt(count_tokens: Callable[[str], int], target: int, overhead: int, rng: random.Random) -> str:
    """The instruction plus sentences until ``overhead`` + the text's tokens reach ``target``.

    Sentences are counted one at a time (each with its leading space, as it sits in the
    text), so the total is off by at most a token or two at the joins; the caller counts
    the whole prompt again.
    """
    parts, total = [_INSTRUCTION], overhead + count_tokens(_INSTRUCTION)
    while total < target:
        text = " " + sentence(rng)
        parts.append(text)
        total += count_tokens(text)
    return "".join(parts)


def long_requests(
    count_tokens: Callable[[str], int], overhead: int, count: int, seed: int
) -> list[LongRequest]:
    """The whole long workload; ``count_tokens`` counts plain text, ``overhead`` is the template's share."""
    rng = random.Random(f"long-prompts-{seed}")
    requests = []
    for prompt_tokens, max_tokens in draw_lengths(count, seed):
        prompt = build_prompt(count_tokens, prompt_tokens, overhead, rng)
        requests.append(LongRequest(prompt, overhead + count_tokens(prompt), max_tokens))
    return requests


def long_body(requests: list[LongRequest]) -> Callable[[int], dict[str, Any]]:
    """Request ``index``'s fields over the load generator's default body: its own prompt and length."""

    def body(index: int) -> dict[str, Any]:
        request = requests[index]
        return {"messages": chat_messages(request.prompt), "max_tokens": request.max_tokens}

    return body


def tokenizer_counters(model_dir: str) -> tuple[Callable[[str], int], int]:
    """The model's plain-text token counter, and the chat template's tokens around a user message."""
    from transformers import AutoTokenizer

    from bench.prompts import render_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count_tokens, len(render_prompt_ids(tokenizer, ""))
