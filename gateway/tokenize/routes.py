"""Owns POST /tokenize and POST /detokenize (vLLM's shapes), answered by a worker's tokenizer.

The work is ``gateway/tokenize/service.py``'s: a short job any worker of the model answers.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.http.deps import JsonBody, RequestIdDep
from gateway.openai.schema import ErrorBody
from gateway.tokenize.schema import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from gateway.tokenize.service import TokenizerDep

router = APIRouter(tags=["tokenizer"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid input: the message and `param` name the problem."},
    504: {"model": ErrorBody, "description": "No worker answered in time."},
}


@router.post("/tokenize", response_model=TokenizeResponse, dependencies=[JsonBody], responses=_ERRORS)
async def tokenize(
    body: TokenizeRequest, tokenizer: TokenizerDep, request_id: RequestIdDep
) -> TokenizeResponse:
    """Token ids of a prompt, or of chat messages rendered with the model's template."""
    return await tokenizer.tokenize(body, request_id)


@router.post("/detokenize", response_model=DetokenizeResponse, dependencies=[JsonBody], responses=_ERRORS)
async def detokenize(
    body: DetokenizeRequest, tokenizer: TokenizerDep, request_id: RequestIdDep
) -> DetokenizeResponse:
    """The text of token ids (special tokens skipped)."""
    return await tokenizer.detokenize(body, request_id)
