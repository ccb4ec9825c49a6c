"""Owns a job's life around the engine: its deadline, its run record, its first events, resume and handover.

A fresh job (attempt 0) is prepared (tokenized, checked), claimed in the run
table (``shared/jobs/run_records.py``) and announced with ``Accepted``. A taken-over job
(attempt k > 0) is claimed, then rebuilt from its own stream: every choice that
has not ended continues from the tokens the client already has (``worker/driver/resume.py``),
with no second ``Accepted``, so the client's stream simply goes on. A job handed
back (drain, or a shutdown that interrupts it) is re-enqueued as the next attempt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.errors import Timeout, TokenferryError
from shared.jobs import jobqueue, run_records
from shared.jobs.arq_seam import QueuePool
from shared.jobs.streams import EventReader, EventWriter
from shared.protocol import Accepted, Failed, GenerationJob, TextPrompt, TokenPrompt
from worker.driver.resume import StreamProgress, progress_of
from worker.engine import EngineRequest
from worker.requests.choices import RequestChoices
from worker.requests.preparation import PreparedRequest
from worker.requests.tokenization import Tokenizer

logger = logging.getLogger(__name__)

Preparer = Callable[[GenerationJob], PreparedRequest]

# Prompts up to this many characters (or token ids), with no grammar or tools, are prepared on
# the event loop: rendering and tokenizing one costs less than a thread's two hand-offs (fake
# engine, c=1, with the gateway's translation also moved to its loop: worker CPU per request
# 4.79 -> 4.38 ms, gateway 6.30 -> 5.23; docs/performance.md).
QUICK_PROMPT_CHARS = 2048


@dataclass(frozen=True, slots=True)
class StartedJob:
    job: GenerationJob
    choices: RequestChoices
    engine_ids: tuple[str, ...]  # choice i's engine id
    to_run: tuple[EngineRequest, ...]  # the choices still to generate
    prompt_tokens: int


class JobLifecycle:
    def __init__(
        self, pool: QueuePool, writer: EventWriter, tokenizer: Tokenizer, preparer: Preparer, worker_id: str
    ) -> None:
        self._pool = pool
        self._writer = writer
        self._reader = EventReader(pool)
        self._tokenizer = tokenizer
        self._prepare = preparer
        self._worker_id = worker_id

    def owner(self, job: GenerationJob) -> str:
        return run_records.owner_token(self._worker_id, job.attempt)

    async def start(self, job: GenerationJob) -> StartedJob | None:
        """Claim and prepare ``job``; None when there is nothing to run (rejected, stale, cancelled, over)."""
        if job.deadline_at is not None and time.time() > job.deadline_at:
            await self._reject(job, Timeout("the request's deadline passed before a worker could start it"))
            return None
        if job.attempt == 0:
            return await self._start_fresh(job)
        return await self._start_resumed(job)

    async def hand_over(self, job: GenerationJob) -> bool:
        """Give ``job`` back to the queue as its next attempt (it must no longer be in the engine);
        False when this worker does not own it (never claimed, or taken over)."""
        attempt = await run_records.hand_over(self._pool, job, self._worker_id)
        if attempt is None:
            logger.info("not handed over: this worker does not own it")
            return False
        await jobqueue.enqueue(self._pool, job.model_copy(update={"attempt": attempt}))
        logger.info("handed over as attempt %d", attempt)
        return True

    async def _start_fresh(self, job: GenerationJob) -> StartedJob | None:
        # Claimed while preparation tokenizes: the claim is one round trip, so it lands long
        # before a long prompt is tokenized, and a death of this worker is seen by the reaper.
        is_claimed, preparation = await asyncio.gather(self._claim(job), self._preparation(job))
        if not is_claimed:
            return None
        if isinstance(preparation, TokenferryError):
            await self._reject(job, preparation, claimed=True)
            return None
        requests = preparation.engine_requests
        if not await self._accept(job, preparation):
            return None
        choices = RequestChoices.start(
            self._tokenizer, requests, preparation.stop_sequences, preparation.parsing
        )
        engine_ids = tuple(request.request_id for request in requests)
        return StartedJob(job, choices, engine_ids, requests, len(requests[0].prompt_token_ids))

    async def _accept(self, job: GenerationJob, prepared: PreparedRequest) -> bool:
        """Publish ``Accepted``, the stream's first event; False when the job is no longer ours."""
        accepted = Accepted(
            prompt_tokens=len(prepared.engine_requests[0].prompt_token_ids),
            worker_id=self._worker_id,
            prompt_text=prepared.echo_text,
        )
        lost = await self._writer.publish_owned(
            [(job.request_id, accepted)], owners={job.request_id: self.owner(job)}, model=job.model
        )
        return not lost

    async def _start_resumed(self, job: GenerationJob) -> StartedJob | None:
        if not await self._claim(job):
            return None
        progress = progress_of(item.event for item in await self._reader.history(job.request_id))
        if progress.is_over:
            return None
        prepared = await self._prepared(job)
        if prepared is None:
            return None
        if not progress.is_accepted and not await self._accept(job, prepared):
            return None  # the attempt before died between its claim and its first event
        requests = prepared.engine_requests
        choices = RequestChoices.start(self._tokenizer, requests, prepared.stop_sequences, prepared.parsing)
        to_run = _resume_choices(choices, requests, progress)
        logger.info(
            "resuming attempt %d: %s tokens already streamed",
            job.attempt,
            "+".join(str(len(choice.token_ids)) for choice in progress.choices.values()) or "0",
        )
        engine_ids = tuple(request.request_id for request in requests)
        return StartedJob(job, choices, engine_ids, to_run, len(requests[0].prompt_token_ids))

    async def _prepared(self, job: GenerationJob) -> PreparedRequest | None:
        """The job's engine requests, or None once a rejection ended it (and its claim)."""
        preparation = await self._preparation(job)
        if isinstance(preparation, TokenferryError):
            await self._reject(job, preparation, claimed=True)
            return None
        return preparation

    async def _preparation(self, job: GenerationJob) -> PreparedRequest | TokenferryError:
        """The job's engine requests, or why it cannot run (tokenized on a thread: prompts may be long,
        and grammars slow to compile; a short plain prompt on the loop, ``prepares_quickly``)."""
        try:
            if prepares_quickly(job):
                return self._prepare(job)
            return await asyncio.to_thread(self._prepare, job)
        except TokenferryError as error:
            return error

    async def _claim(self, job: GenerationJob) -> bool:
        claim = await run_records.begin(self._pool, job, self._worker_id)
        if claim is not run_records.Claim.OK:
            logger.info("not started: attempt %d is %s", job.attempt, claim.value)
        return claim is run_records.Claim.OK

    async def _reject(self, job: GenerationJob, error: TokenferryError, *, claimed: bool = False) -> None:
        logger.info("rejected: %s", error.message)
        failed = [(job.request_id, Failed(error=error.to_info()))]
        if claimed:  # the terminal event also ends the claim
            await self._writer.publish_owned(
                failed, owners={job.request_id: self.owner(job)}, model=job.model
            )
        else:
            await self._writer.publish_step(failed)


def _resume_choices(
    choices: RequestChoices, requests: tuple[EngineRequest, ...], progress: StreamProgress
) -> tuple[EngineRequest, ...]:
    """Bring each choice's output up to the stream; the engine requests of those still running."""
    to_run: list[EngineRequest] = []
    for index, request in enumerate(requests):
        choice = progress.choice(index)
        if choice.is_finished:
            choices.ended += 1
            continue
        choices.outputs[index].replay(choice.token_ids, choice.text)
        to_run.append(
            dataclasses.replace(
                request,
                prompt_token_ids=request.prompt_token_ids + tuple(choice.token_ids),
                resumed_tokens=len(choice.token_ids),
                prompt_logprobs=None,  # sent with the choice's first delta already
            )
        )
    return tuple(to_run)


def prepares_quickly(job: GenerationJob) -> bool:
    """Whether preparing ``job`` is too little work to send to a thread: a short prompt with no
    grammar to compile and no tools to render."""
    if job.constraint is not None or job.tool_choice is not None:
        return False
    prompt = job.prompt
    if isinstance(prompt, TokenPrompt):
        return len(prompt.token_ids) <= QUICK_PROMPT_CHARS
    if isinstance(prompt, TextPrompt):
        return len(prompt.text) <= QUICK_PROMPT_CHARS
    if prompt.tools:
        return False
    return sum(len(message.content or "") for message in prompt.messages) <= QUICK_PROMPT_CHARS
