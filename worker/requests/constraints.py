"""Owns which constraint a job's output must match, compiled for the model: structured outputs or a tool call.

A job carries at most one: its own ``constraint`` (response_format, structured_outputs,
guided_*), or the one a chat prompt's tool choice implies (``required`` or a named
function: ``shared.structured.tools.call_constraint``). Asking both is refused: one
output cannot be two documents. Compiling happens here, in the job's preparation
(on a thread, never on the engine's step loop), so a grammar this tokenizer cannot
enforce is a 400 naming its parameter before any SSE byte.

With a reasoning parser, the grammar carries the model's thinking markers: it waits
for the thinking to end (``worker/engine/reasoning_gate.py``, ``thinking.py``).
"""

from __future__ import annotations

import dataclasses

from shared.errors import InvalidRequest
from shared.protocol import ChatPrompt, Constraint, GenerationJob
from shared.structured.grammars import grammar_for
from shared.structured.tools import call_constraint
from worker.engine import EngineRequest, ThinkingMarkers
from worker.engine.grammar import GrammarCompiler


def constrain(
    request: EngineRequest,
    job: GenerationJob,
    grammars: GrammarCompiler | None,
    thinking: ThinkingMarkers | None = None,
) -> EngineRequest:
    """``request`` with the job's grammar compiled; unchanged without one, or without ``grammars``.

    ``grammars`` is None only for the fake engine, which ignores constraints. ``thinking``:
    the grammar is dormant until the model has thought (None: it holds from the first token).
    """
    constraint = job_constraint(job)
    if constraint is None or grammars is None:
        return request
    if request.sampling.num_beams > 1:
        raise InvalidRequest(
            f"{constraint.param} cannot be combined with beam search (num_beams).", param=constraint.param
        )
    grammar = grammars.compile(grammar_for(constraint), constraint.param)
    return dataclasses.replace(request, grammar=grammar, thinking=thinking)


def job_constraint(job: GenerationJob) -> Constraint | None:
    """The constraint the job's output must match; None for free text."""
    prompt, choice = job.prompt, job.tool_choice
    calls = None
    if isinstance(prompt, ChatPrompt) and prompt.tools and choice is not None:
        calls = call_constraint(prompt.tools, choice)
    if calls is not None and job.constraint is not None:
        raise InvalidRequest(
            "response_format cannot be combined with tool_choice 'required' or a named function: "
            "the output would have to be both.",
            param="response_format",
        )
    return job.constraint if job.constraint is not None else calls
