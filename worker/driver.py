"""Owns the async side of the engine: feeding it jobs, stepping it off the event loop, publishing events.

Concurrency model: one dedicated thread runs ``engine.step()``; everything else
(admission, aborts, event routing, Redis I/O) happens on the event loop. The
engine is touched only between steps: job coroutines put adds and aborts in an
inbox that the loop applies before the next step, so no lock is needed and the
engine stays single-threaded. All events of one step go to Redis in one pipeline,
and a request's coroutine is released only after its terminal event is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from redis.exceptions import RedisError

from shared.errors import TokenferryError, WorkerFailed
from shared.logs import request_context
from shared.protocol import Accepted, Failed, GenerationJob, TokenEvent
from shared.streams import EventWriter
from worker.admission import AdmittedRequest
from worker.engine import Engine, EngineRequest, SequenceUpdate
from worker.output import RequestOutput
from worker.tokenization import Tokenizer

logger = logging.getLogger(__name__)

_PUBLISH_RETRY_S = (0.1, 0.25, 0.5, 1.0, 2.0)

Admitter = Callable[[GenerationJob], AdmittedRequest]


@dataclass
class _Active:
    output: RequestOutput
    done: asyncio.Future[None]


class EngineDriver:
    """Runs an ``Engine`` for many concurrent jobs; ``run(job)`` returns when the job has finished."""

    def __init__(
        self, engine: Engine, tokenizer: Tokenizer, admitter: Admitter, writer: EventWriter, worker_id: str
    ) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._admit = admitter
        self._writer = writer
        self._worker_id = worker_id
        self._active: dict[str, _Active] = {}
        self._inbox: list[EngineRequest | str] = []  # a request to add, or an id to abort
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")

    async def run(self, job: GenerationJob) -> None:
        """Admit ``job``, stream its events, return when its terminal event is stored."""
        try:
            admitted = await asyncio.to_thread(self._admit, job)
        except TokenferryError as error:
            logger.info("rejected: %s", error.message)
            await self._writer.publish_step([(job.request_id, Failed(error=error.to_info()))])
            return
        request = admitted.engine_request
        accepted = Accepted(
            prompt_tokens=len(request.prompt_token_ids),
            worker_id=self._worker_id,
            prompt_text=admitted.echo_text,
        )
        await self._writer.publish_step([(job.request_id, accepted)])
        output = RequestOutput.start(self._tokenizer, request.prompt_token_ids, admitted.stop_sequences)
        active = _Active(output, asyncio.get_running_loop().create_future())
        self._active[job.request_id] = active
        self._post(request)
        try:
            await active.done
        except asyncio.CancelledError:
            self._forget(job.request_id)
            raise

    def _forget(self, request_id: str) -> None:
        if self._active.pop(request_id, None) is not None:
            self._post(request_id)

    def _post(self, item: EngineRequest | str) -> None:
        self._inbox.append(item)
        self._wake.set()

    async def serve(self) -> None:
        """The step loop; runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._apply_inbox()
            if not self._engine.has_unfinished():
                self._wake.clear()
                continue
            try:
                updates = await loop.run_in_executor(self._executor, self._engine.step)
            except Exception:
                logger.exception("engine step failed; failing its requests")
                await self._fail_all()
                continue
            finished, events = self._route(updates)
            await self._publish(events)
            for request_id in finished:
                self._release(request_id)

    def _apply_inbox(self) -> None:
        inbox, self._inbox = self._inbox, []
        for item in inbox:
            if isinstance(item, str):
                self._engine.abort(item)
            else:
                self._engine.add(item)

    def _route(self, updates: list[SequenceUpdate]) -> tuple[list[str], list[tuple[str, TokenEvent]]]:
        finished: list[str] = []
        events: list[tuple[str, TokenEvent]] = []
        for update in updates:
            active = self._active.get(update.request_id)
            if active is None:
                continue  # aborted while the step ran
            with request_context(update.request_id):
                produced = active.output.consume(update)
            events.extend((update.request_id, event) for event in produced)
            if produced and produced[-1].type == "finished":
                finished.append(update.request_id)
                if not update.is_finished:
                    self._engine.abort(update.request_id)  # a stop sequence ended it; safe between steps
        return finished, events

    async def _publish(self, events: list[tuple[str, TokenEvent]]) -> None:
        """Publish one step's events, retrying through short Redis outages so nothing is lost."""
        attempt = 0
        while True:
            try:
                await self._writer.publish_step(events)
                return
            except RedisError as error:
                # The engine does not step meanwhile: generation pauses instead of dropping tokens.
                delay = _PUBLISH_RETRY_S[min(attempt, len(_PUBLISH_RETRY_S) - 1)]
                logger.warning("publishing a step failed (%s); retrying in %.2f s", error, delay)
                await asyncio.sleep(delay)
                attempt += 1

    def _release(self, request_id: str) -> None:
        active = self._active.pop(request_id, None)
        if active is not None and not active.done.done():
            active.done.set_result(None)

    async def _fail_all(self) -> None:
        failure = Failed(error=WorkerFailed("the model failed while generating this request").to_info())
        request_ids = list(self._active)
        for request_id in request_ids:
            self._engine.abort(request_id)
        await self._publish([(request_id, failure) for request_id in request_ids])
        for request_id in request_ids:
            self._release(request_id)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._engine.close()
