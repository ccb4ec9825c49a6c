"""Owns the structured-output phase of ``python -m bench``: what JSON-schema constraints cost the batch.

Two measurements, each a batch of ``ROWS`` (32) requests where half carry a JSON schema,
against the same batch with none, in the same run:

- in process (``in_process``, with the references): the worker's engine on the
  worker-configured model, each batch run twice (free, constrained, constrained, free:
  this VM's speed drifts by 10-20 % within minutes); it also times compiling the schemas for the model's
  vocabulary (p50/p99 over ``COMPILE_ROUNDS`` fresh compilers, as a worker compiles each
  new schema once) and reports the engine's own mask time per fill (one fill per
  forward with constrained rows: the step's share that the grammars cost);
- served (``served``, after the sweep): 32 concurrent streamed chat requests, half with
  ``response_format: {"type": "json_schema", ...}`` as the OpenAI SDK sends it. The line
  says how many constrained streams started as JSON (``enforced_json``): a gateway that
  ignores the field runs them as free text, and then the ratio measures nothing.

Every request is forced to the same length (``ignore_eos``, greedy), and each schema asks
for at least 40 array items, more than the default 64 tokens can hold, so a constrained
row never ends early: both batches keep 32 rows to the end and the ratio of their tok/s
is the constraints' cost alone. Each constrained request has a schema of its own (16
distinct texts), so the worker compiles each once, on its preparation threads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bench import load
from bench.stats import percentile, summarize_level

if TYPE_CHECKING:
    from worker.engine import EngineRequest
    from worker.engine.grammar import GrammarCompiler
    from worker.model.loading import LoadedModel

ROWS = 32
COMPILE_ROUNDS = 5
_FIELDS = ("notes", "steps", "items", "facts", "names", "ideas", "lines", "words")


def bench_schema(index: int) -> dict[str, Any]:
    """The ``index``-th schema: distinct text for every index, at least 40 strings long."""
    field = f"{_FIELDS[index % len(_FIELDS)]}_{index}"
    return {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 8 + index % 8},
            field: {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 40},
        },
        "required": ["title", field],
        "additionalProperties": False,
    }


def is_constrained(index: int) -> bool:
    """Every other request of a batch carries a schema: constrained and free rows interleave."""
    return index % 2 == 0


def response_format(index: int) -> dict[str, Any]:
    """The OpenAI request field for request ``index``'s schema."""
    schema = {"name": f"bench_{index}", "schema": bench_schema(index), "strict": True}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}


def _compiler(loaded: LoadedModel) -> GrammarCompiler:
    from worker.engine.grammar import GrammarCompiler

    eos = loaded.generation_config.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [loaded.tokenizer.eos_token_id])
    return GrammarCompiler.for_hf_tokenizer(loaded.tokenizer, int(loaded.model.config.vocab_size), eos_ids)


def _grammar_text(index: int) -> str:
    from shared.protocol import JsonConstraint
    from shared.structured.grammars import grammar_for

    return grammar_for(JsonConstraint(json_schema=bench_schema(index)))


def compile_times(loaded: LoadedModel, rows: int) -> dict[str, Any]:
    """Compile the batch's schemas on fresh compilers, ``COMPILE_ROUNDS`` times: p50/p99 in ms."""
    texts = [_grammar_text(index) for index in range(rows) if is_constrained(index)]
    seconds: list[float] = []
    for _ in range(COMPILE_ROUNDS):
        compiler = _compiler(loaded)
        for text in texts:
            started = time.perf_counter()
            compiler.compile(text, "response_format")
            seconds.append(time.perf_counter() - started)
    return {
        "compiles": len(seconds),
        "compile_ms_p50": round((percentile(seconds, 50) or 0.0) * 1000, 3),
        "compile_ms_p99": round((percentile(seconds, 99) or 0.0) * 1000, 3),
    }


def _requests(
    loaded: LoadedModel, prompts: Sequence[list[int]], new_tokens: int, constrained: bool
) -> list[EngineRequest]:
    import dataclasses

    from bench.references import engine_request

    compiler = _compiler(loaded)
    requests = [engine_request(f"r{index}", prompt, new_tokens) for index, prompt in enumerate(prompts)]
    return [
        dataclasses.replace(request, grammar=compiler.compile(_grammar_text(index), "response_format"))
        if constrained and is_constrained(index)
        else request
        for index, request in enumerate(requests)
    ]


def _run_batch(loaded: LoadedModel, requests: list[EngineRequest]) -> dict[str, Any]:
    from bench.references import worker_engine

    engine = worker_engine(loaded, max_batch_size=len(requests))
    for request in requests:
        engine.add(request)
    started, tokens = time.perf_counter(), 0
    while engine.has_unfinished():
        tokens += sum(len(update.new_token_ids) for update in engine.step())
    stats = engine.stats()
    return {
        "output_tokens": tokens,
        "wall_s": time.perf_counter() - started,
        "mask_s": stats.grammar_mask_seconds,
        "mask_fills": stats.grammar_mask_fills,
    }


def in_process(loaded: LoadedModel, prompts: Sequence[list[int]], new_tokens: int) -> dict[str, Any]:
    """The engine alone: ``len(prompts)`` rows free, and the same rows with half constrained.

    Run free, constrained, constrained, free (each batch on a fresh engine; the second
    constrained one finds its grammars cached, as a worker does for a schema it has seen):
    a drift of the machine's speed during the phase weighs on both alike.
    """
    free_requests = _requests(loaded, prompts, new_tokens, constrained=False)
    mixed_requests = _requests(loaded, prompts, new_tokens, constrained=True)
    runs = [
        _run_batch(loaded, batch) for batch in (free_requests, mixed_requests, mixed_requests, free_requests)
    ]
    free, mixed = _combined(runs[0], runs[3]), _combined(runs[1], runs[2])
    return {
        "rows": len(prompts),
        "constrained_rows": sum(is_constrained(index) for index in range(len(prompts))),
        "free": free,
        "half_constrained": mixed,
        "tokens_per_s_ratio": round(mixed["output_tokens_per_s"] / free["output_tokens_per_s"], 3),
        **compile_times(loaded, len(prompts)),
    }


def _combined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two runs of one batch as one: tokens and time summed, the mask per fill averaged."""
    tokens, wall = first["output_tokens"] + second["output_tokens"], first["wall_s"] + second["wall_s"]
    mask_seconds, fills = first["mask_s"] + second["mask_s"], first["mask_fills"] + second["mask_fills"]
    return {
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2),
        "mask_ms_per_fill": round(mask_seconds / fills * 1000, 3) if fills else None,
        "mask_share_of_wall": round(mask_seconds / wall, 4),
    }


def _starts_as_json(text: str) -> bool:
    return text.lstrip().startswith("{")


async def served(
    base_url: str, model: str, new_tokens: int, first_prompt: int, max_seconds: float
) -> dict[str, Any]:
    """Through the gateway: one wave of ``ROWS`` free requests, then one with half constrained.

    The second wave takes the next ``ROWS`` prompts: the first wave's are in the worker's prefix cache.
    """
    free = await _served_level(base_url, model, new_tokens, first_prompt, max_seconds, None)
    mixed = await _served_level(base_url, model, new_tokens, first_prompt + ROWS, max_seconds, _extra_body)
    constrained = sum(is_constrained(index) for index in range(ROWS))
    free_rate, mixed_rate = free["output_tokens_per_s"], mixed["output_tokens_per_s"]
    # Refused or unconstrained streams make the comparison meaningless: no ratio then.
    compared = mixed["enforced_json"] == constrained and free_rate and mixed_rate
    return {
        "concurrency": ROWS,
        "constrained_requests": constrained,
        "free": free,
        "half_constrained": mixed,
        "tokens_per_s_ratio": round(mixed_rate / free_rate, 3) if compared else None,
    }


async def _served_level(
    base_url: str,
    model: str,
    new_tokens: int,
    first_prompt: int,
    max_seconds: float,
    extra_body: load.ExtraBody | None,
) -> dict[str, Any]:
    run = await load.run_level(
        base_url,
        model,
        concurrency=ROWS,
        requests=ROWS,
        max_tokens=new_tokens,
        max_seconds=max_seconds,
        first_prompt=first_prompt,
        extra_body=extra_body,
    )
    level = {"partial": run.deadline_hit, **summarize_level(run.records, run.wall_s, new_tokens)}
    constrained = [record for record in run.records if is_constrained(record.index)]
    level["enforced_json"] = (
        sum(_starts_as_json(record.content) for record in constrained) if extra_body else 0
    )
    return level


def _extra_body(index: int) -> dict[str, Any]:
    return response_format(index) if is_constrained(index) else {}
