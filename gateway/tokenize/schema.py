"""Owns the HTTP schema of POST /tokenize and POST /detokenize (vLLM's shapes).

Tokenize takes either a ``prompt`` (encoded as a completion prompt would be) or
``messages`` (rendered with the model's chat template first, as a chat request
would be). Unknown fields are ignored, as in the OpenAI schema.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gateway.openai.schema import ChatMessageParam


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TokenizeRequest(_Request):
    """Body of POST /tokenize: give ``prompt`` or ``messages``, not both."""

    model: str = Field(description="Name of a model served by a live worker (its tokenizer is used).")
    prompt: str | None = Field(None, description="Text to tokenize as a completion prompt.")
    messages: list[ChatMessageParam] | None = Field(
        None, min_length=1, description="A conversation to render with the chat template, then tokenize."
    )
    add_generation_prompt: bool = Field(True, description="With messages: end with the assistant's turn.")
    add_special_tokens: bool | None = Field(
        None,
        description="Add the tokenizer's special tokens (BOS); default: yes for a prompt, no for messages "
        "(the chat template writes its own).",
    )


class TokenizeResponse(BaseModel):
    count: int = Field(description="Number of tokens.")
    max_model_len: int = Field(description="The model's context window, in tokens.")
    tokens: list[int]


class DetokenizeRequest(_Request):
    """Body of POST /detokenize."""

    model: str = Field(description="Name of a model served by a live worker (its tokenizer is used).")
    tokens: list[int] = Field(description="Token ids to decode (special tokens are skipped).")


class DetokenizeResponse(BaseModel):
    prompt: str = Field(description="The decoded text.")
