"""Owns the public schema of HuggingFace TGI's native API: /generate, /generate_stream, /, /info.

Shapes follow text-generation-inference's ``router/src/lib.rs`` (``GenerateParameters``,
``GenerateResponse``, ``StreamResponse``, ``Info``, ``ErrorResponse``) and its
bounds follow ``router/src/validation.rs`` (``top_p`` and ``typical_p`` strictly
inside (0, 1), ``temperature`` and ``top_k`` strictly positive), so
``huggingface_hub.InferenceClient.text_generation`` and TGI's own client work
unchanged. Like TGI (serde without ``deny_unknown_fields``), unknown fields are ignored.
Translation to the job protocol is ``gateway/tgi/translate.py``'s business.

Intentional divergences from TGI:

* a feature we do not implement (``truncate``, ``watermark``, ``adapter_id``,
  ``decoder_input_details``, ``best_of`` > 1) is refused with a validation error
  naming it, never silently ignored;
* ``model`` (optional, top level) picks a model when the gateway serves several;
  TGI serves one and has no such field;
* ``Info`` leaves out the fields describing TGI's router internals
  (``max_concurrent_requests``, ``validation_workers``) rather than invent values.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import MISSING, AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from gateway.openai.fields import refuse_when
from gateway.openai.limits import (
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_TOKEN_COUNT,
    STOP_LIST_SCHEMA,
    validate_stop,
)

# TGI's defaults for the router flags of the same names (its max_stop_sequences is our 4 too).
MAX_TOP_N_TOKENS = 5
# A u64 in TGI; bounded here so any seed we accept is one every engine can take.
MAX_SEED = 2**63 - 1


def _is_true(value: Any) -> bool:
    return value is True


def _is_not_none(value: Any) -> bool:
    return value is not None


def _is_more_than_one(value: Any) -> bool:
    return value is not None and value > 1


class _Request(BaseModel):
    # Strict, like serde: `"stream": 0` or `"top_k": "5"` are type errors, not coerced guesses.
    # inf and nan parse from JSON (1e999) but are no sampling parameter's value.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class Grammar(_Request):
    """TGI's ``GrammarType``: ``{"type": "json", "value": <schema>}`` (``json_object`` is its alias;
    the schema may also come as JSON text), ``{"type": "regex", "value": "..."}``, or
    ``{"type": "json_schema", "value": {"name": ..., "schema": <schema>}}``.
    ``gateway/tgi/translate.py`` turns it into a constraint."""

    type: Literal["json", "json_object", "regex", "json_schema"]
    value: Any


class GenerateParameters(_Request):
    """TGI's generation parameters; None means "not given" (the server default applies)."""

    best_of: Annotated[
        int | None,
        Field(gt=0, description="Only 1 is supported."),
        refuse_when(_is_more_than_one, "best_of greater than 1 is not supported."),
    ] = None
    temperature: float | None = Field(None, gt=0, description="Sampling temperature; implies sampling.")
    repetition_penalty: float | None = Field(None, gt=0, description="1.0 means no penalty.")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="-2.0 to 2.0.")
    top_k: int | None = Field(
        None, gt=0, le=MAX_TOKEN_COUNT, description="Keep the k most likely tokens; implies sampling."
    )
    top_p: float | None = Field(None, gt=0, lt=1, description="Nucleus mass in (0, 1); implies sampling.")
    typical_p: float | None = Field(None, gt=0, lt=1, description="Typical mass in (0, 1); implies sampling.")
    do_sample: bool = Field(False, description="Sample instead of greedy decoding.")
    max_new_tokens: int | None = Field(
        None, gt=0, le=MAX_TOKEN_COUNT, description="Most tokens to generate; default: all room left."
    )
    return_full_text: bool | None = Field(None, description="Prepend the inputs to generated_text.")
    stop: Annotated[
        list[str],
        AfterValidator(validate_stop),
        WithJsonSchema(STOP_LIST_SCHEMA),
        Field(
            description=f"Up to {MAX_STOP_SEQUENCES} sequences ({MAX_STOP_CHARS} characters each) "
            "where generation stops."
        ),
    ] = []
    truncate: Annotated[
        int | None,
        Field(description="Not supported."),
        refuse_when(_is_not_none, "truncate is not supported."),
    ] = None
    watermark: Annotated[
        bool, Field(description="Not supported."), refuse_when(_is_true, "watermark is not supported.")
    ] = False
    details: bool = Field(False, description="Return tokens, finish reason and seed with the text.")
    decoder_input_details: Annotated[
        bool,
        Field(description="Not supported."),
        refuse_when(_is_true, "decoder_input_details is not supported."),
    ] = False
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="Seed for reproducible sampling.")
    top_n_tokens: int | None = Field(
        None, ge=0, le=MAX_TOP_N_TOKENS, description="Also return the n most likely tokens at each step."
    )
    grammar: Grammar | None = Field(
        None, description="What the output must match: a JSON schema or a regular expression."
    )
    adapter_id: Annotated[
        str | None,
        Field(description="Not supported."),
        refuse_when(_is_not_none, "adapter_id is not supported."),
    ] = None


class GenerateRequest(_Request):
    """Body of POST /generate and /generate_stream."""

    inputs: str = Field(min_length=1, description="The prompt, used as is (no chat template).")
    # TGI samples when `parameters` is absent altogether, and decodes greedily for `{}`.
    parameters: GenerateParameters | None = Field(None, description="Generation parameters.")
    model: str | None = Field(
        None, description="tokenferry extension: the model, needed only when several are served."
    )


class CompatGenerateRequest(GenerateRequest):
    """Body of POST /: /generate or /generate_stream, chosen by ``stream``."""

    stream: bool = Field(False, description="Stream tokens as server-sent events.")


# Responses. Optional lists TGI skips when empty are MISSING here (left out, not null).

TgiFinishReason = Literal["length", "eos_token", "stop_sequence"]


class Token(BaseModel):
    id: int
    text: str
    logprob: float | None = Field(description="Log-probability; null when the worker did not report it.")
    special: bool


class PrefillToken(BaseModel):
    id: int
    text: str
    logprob: float | None


class Details(BaseModel):
    finish_reason: TgiFinishReason
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken] = []
    tokens: list[Token]
    top_tokens: list[list[Token]] | MISSING = MISSING


class GenerateResponse(BaseModel):
    generated_text: str
    details: Details | MISSING = MISSING


class StreamDetails(BaseModel):
    finish_reason: TgiFinishReason
    generated_tokens: int
    seed: int | None
    input_length: int


class StreamResponse(BaseModel):
    """One ``data:`` event of /generate_stream: a token; the last also has the text and details."""

    index: int
    token: Token
    top_tokens: list[Token] | MISSING = MISSING
    generated_text: str | None = None
    details: StreamDetails | None = None


class Info(BaseModel):
    model_id: str
    model_sha: str | None = None
    model_pipeline_tag: str | None = "text-generation"
    max_best_of: int = 1
    max_stop_sequences: int = MAX_STOP_SEQUENCES
    max_input_tokens: int = Field(description="Longest prompt, in tokens.")
    max_total_tokens: int = Field(description="Longest prompt plus generation, in tokens.")
    max_client_batch_size: int = 1
    router: str = "tokenferry"
    version: str
    sha: str | None = None
    docker_label: str | None = None


class TgiErrorBody(BaseModel):
    """TGI's error shape, on TGI routes and as an in-stream ``data:`` event."""

    error: str
    error_type: str
