"""Owns the workload: distinct short user prompts, and their rendering into token ids for the references.

Every request gets a different user prompt; all are one short sentence (about
40 tokens once the chat template wraps them). What they do share is the
template's start (SmolLM2's default system prompt, ~24 tokens), as every chat
request to this model does: the worker's prefix cache reuses it, as vLLM's and
SGLang's do, while the transformers references recompute it. To measure
without it: ``--worker-arg=--prefix-cache-tokens=0``. The
references render them exactly as the worker does (``worker/requests/preparation.py``):
chat template as text, then ``encode(add_special_tokens=False)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_SUBJECTS = (
    "a lighthouse keeper", "a lost robot", "a mountain village", "an old bicycle",
    "a chess champion", "a desert caravan", "a quiet library", "a paper airplane",
    "a river otter", "a night train", "a retired astronaut", "a tiny bakery",
    "a glass bridge", "a forgotten song", "a clockmaker", "a winter garden",
)  # fmt: skip
_TASKS = (
    "Write a short story about {}.",
    "Describe {} in a few sentences.",
    "Explain to a child what makes {} special.",
    "Write a poem about {}.",
)


def user_prompt(index: int) -> str:
    """The ``index``-th prompt; distinct for every index."""
    subject = _SUBJECTS[index % len(_SUBJECTS)]
    task = _TASKS[(index // len(_SUBJECTS)) % len(_TASKS)]
    text = task.format(subject)
    cycle = index // (len(_SUBJECTS) * len(_TASKS))
    return text if cycle == 0 else f"{text} (Variation {cycle}.)"


def user_prompts(count: int) -> list[str]:
    return [user_prompt(index) for index in range(count)]


def chat_messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def render_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """The token ids the worker would feed the model for this chat prompt."""
    text = tokenizer.apply_chat_template(chat_messages(prompt), add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(str(text), add_special_tokens=False))
