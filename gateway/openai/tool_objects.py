"""Owns the response shapes of an assistant's tool calls (and deprecated function call), whole and streamed.

Streamed, a call arrives as OpenAI sends it: its first chunk carries ``index``,
``id``, ``type`` and ``function.name`` (with the first piece of its arguments), the
next ones ``index`` and ``function.arguments`` pieces only; the SDKs join the pieces
by ``index``. Keys a chunk does not carry are left out (``MISSING``), not null.
"""

from __future__ import annotations

from typing import Literal

from pydantic import MISSING, BaseModel, Field


class FunctionCallObject(BaseModel):
    name: str
    arguments: str = Field(description="The arguments as JSON text.")


class ToolCallObject(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallObject


class FunctionCallChunk(BaseModel):
    name: str | MISSING = MISSING
    arguments: str | MISSING = MISSING


class ToolCallChunk(BaseModel):
    index: int = Field(description="Which call of the choice this piece belongs to.")
    id: str | MISSING = MISSING
    type: Literal["function"] | MISSING = MISSING
    function: FunctionCallChunk
