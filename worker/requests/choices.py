"""Owns one request's choices: its n outputs, and the terminal ``Finished`` once every choice has ended.

A request with ``n`` choices runs as ``n`` engine sequences on one worker, all
publishing to the request's one stream (so resume and abort stay per request).
Choice 0 keeps the request id as its engine id and choice i > 0 gets
``{request_id}#{i}``; with a seed, choice i samples with seed + i, so choices
differ yet each is reproducible. Every choice ends with its own ``ChoiceFinished``;
the request's ``Finished`` follows the last of them, with the usage of all
(the prompt counted once, as OpenAI does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shared.protocol import ChoiceFinished, Finished, TokenEvent, Usage
from worker.engine import EngineRequest, SequenceUpdate
from worker.requests.output import RequestOutput
from worker.requests.output_parsing import OutputParsing
from worker.requests.tokenization import Tokenizer


def choice_engine_id(request_id: str, index: int) -> str:
    """The engine's id for choice ``index`` of ``request_id``."""
    return request_id if index == 0 else f"{request_id}#{index}"


def choice_requests(base: EngineRequest, n: int) -> tuple[EngineRequest, ...]:
    """One engine request per choice; seeded choices get consecutive seeds."""
    seed = base.sampling.seed
    return tuple(
        dataclasses.replace(
            base,
            request_id=choice_engine_id(base.request_id, index),
            sampling=dataclasses.replace(base.sampling, seed=None if seed is None else seed + index),
        )
        for index in range(n)
    )


@dataclass
class RequestChoices:
    """The outputs of one request's choices, indexed by choice."""

    outputs: list[RequestOutput]
    ended: int = 0

    @classmethod
    def start(
        cls,
        tokenizer: Tokenizer,
        requests: tuple[EngineRequest, ...],
        stop_sequences: tuple[str, ...],
        parsing: OutputParsing | None = None,
    ) -> RequestChoices:
        return cls(
            [
                RequestOutput.start(
                    tokenizer,
                    request.prompt_token_ids,
                    stop_sequences,
                    index=index,
                    wants_logprobs=request.logprobs is not None,
                    parsing=parsing,
                )
                for index, request in enumerate(requests)
            ]
        )

    def consume(self, index: int, update: SequenceUpdate) -> list[TokenEvent]:
        """Events for one choice's update; ends with ``Finished`` once the last choice has ended."""
        events = self.outputs[index].consume(update)
        if not events or not isinstance(events[-1], ChoiceFinished):
            return events
        self.ended += 1
        if self.ended == len(self.outputs):
            events.append(self._finished(events[-1]))
        return events

    def _finished(self, last: ChoiceFinished) -> Finished:
        usage = Usage(
            prompt_tokens=self.outputs[0].prompt_tokens,
            completion_tokens=sum(output.completion_tokens for output in self.outputs),
            reasoning_tokens=sum(output.reasoning_tokens for output in self.outputs),
            # One prompt for every choice: each may have been served from the cache, at most once.
            cached_tokens=max(output.cached_prompt_tokens for output in self.outputs),
        )
        return Finished(finish_reason=last.finish_reason, usage=usage, stop_sequence=last.stop_sequence)
