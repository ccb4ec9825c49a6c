"""Owns the warm-up: one short generation through a freshly loaded engine, before the worker is ready.

The first forward pass pays for what loading does not: lazy CUDA and oneDNN
initialisation, kernel selection, a ``torch.compile`` trace. Paid here, it delays
the worker's readiness (``worker/probes.py``) instead of the first user's first
token. A model that cannot run a five-token prompt cannot serve, so a failed
warm-up stops the worker at start-up, before it takes a job.

Where the engine enforces grammars, the warm-up request is constrained (a small
JSON schema): the first compile and masks build llguidance's lazy tables here, off
the first structured-output request's path.
"""

from __future__ import annotations

from worker.engine import EngineRequest, SamplingParams
from worker.model.backend import Backend

WARM_UP_REQUEST_ID = "warm-up"
WARM_UP_PROMPT = "Hello, how are you?"
WARM_UP_NEW_TOKENS = 2  # one prefill, then one decode step: both paths run once


def warm_up(backend: Backend) -> None:
    """Run one greedy request to its end on ``backend``'s engine (blocking: call off the loop)."""
    engine = backend.engine
    prompt = tuple(backend.tokenizer.encode(WARM_UP_PROMPT, add_special_tokens=True))
    grammar = backend.grammars.warm_up() if backend.grammars is not None else None
    engine.add(
        EngineRequest(
            request_id=WARM_UP_REQUEST_ID,
            prompt_token_ids=prompt,
            sampling=SamplingParams(),
            max_new_tokens=WARM_UP_NEW_TOKENS,
            eos_token_ids=frozenset(),
            grammar=grammar,
        )
    )
    while engine.has_unfinished():
        for update in engine.step():
            if update.failed:
                raise RuntimeError("the model failed its warm-up generation; see the log above")
