"""Owns the requests in the engine and turning a step's updates into their events.

A request with n choices runs as n engine sequences (``worker/requests/choices.py``);
``RequestRouter`` maps each engine id back to its request and choice, and routes each
update through that request's choices into ``TokenEvent``s. Batch-lane jobs' events
are held and published merged (``worker/driver/held_events.py``): nobody reads them
token by token.

A sequence the engine could not run (a ``failed`` update) fails its request alone,
with a fixed message (``MODEL_FAILED``); its other choices leave the engine.

Everything here runs on the driver's event loop, between steps
(``worker/driver/engine_driver.py``). The router never touches the engine: the
sequences it ends (a stop sequence, a failed sibling, a request forgotten) go to
the driver's inbox through ``post``, which the loop applies before the next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from shared.errors import WorkerFailed
from shared.keys import Lane
from shared.logs import request_context
from shared.protocol import Failed, GenerationJob, TokenEvent
from worker.driver.held_events import HeldEvents
from worker.driver.interactive_starts import InteractiveStarts
from worker.driver.lifecycle import StartedJob
from worker.engine import EngineRequest, SequenceUpdate
from worker.requests.choices import RequestChoices

logger = logging.getLogger(__name__)

MODEL_FAILED = "the model failed while generating this request"


@dataclass
class _Active:
    job: GenerationJob
    owner: str  # the owner token its events are fenced with
    choices: RequestChoices
    engine_ids: tuple[str, ...]  # choice i runs in the engine as engine_ids[i]
    done: asyncio.Future[None]


class RequestRouter:
    """The requests the driver runs, by request id and by engine id; routes their updates."""

    def __init__(
        self, post: Callable[[EngineRequest | str], None], starts: InteractiveStarts, held: HeldEvents
    ) -> None:
        self._post = post  # to the driver's inbox: a request to add, or an id to abort
        self._starts = starts
        self._held = held
        self._active: dict[str, _Active] = {}
        self._choice_of: dict[str, tuple[str, int]] = {}  # engine id -> (request id, choice index)

    def __len__(self) -> int:
        return len(self._active)

    def request_ids(self) -> list[str]:
        return list(self._active)

    def in_lane(self, lane: str) -> int:
        return sum(1 for active in self._active.values() if active.job.lane == lane)

    def interactive_ids(self) -> list[str]:
        return [
            request_id for request_id, active in self._active.items() if active.job.lane != Lane.BATCH.value
        ]

    def abandon(self, request_id: str) -> tuple[str, ...]:
        """Drop ``request_id``'s held events (a failed step ends it); its engine ids, to abort."""
        self._held.drop(request_id)
        return self._active[request_id].engine_ids

    def owners(self, events: list[tuple[str, TokenEvent]]) -> dict[str, str]:
        """The owner token each event's request is fenced with."""
        return {request_id: self._active[request_id].owner for request_id, _ in events}

    def add(self, started: StartedJob, owner: str) -> asyncio.Future[None]:
        """Run ``started``'s remaining choices; the future resolves when its request is released."""
        job = started.job
        active = _Active(
            job, owner, started.choices, started.engine_ids, asyncio.get_running_loop().create_future()
        )
        self._active[job.request_id] = active
        index_of = {engine_id: index for index, engine_id in enumerate(started.engine_ids)}
        for request in started.to_run:
            self._choice_of[request.request_id] = (job.request_id, index_of[request.request_id])
            self._post(request)
        return active.done

    def forget(self, request_id: str, *, release: bool = False) -> None:
        """Take ``request_id`` out of the engine; ``release`` also lets its ``run`` return."""
        active = self._active.pop(request_id, None)
        if active is None:
            return
        self._held.drop(request_id)
        for engine_id in active.engine_ids:
            if self._choice_of.pop(engine_id, None) is not None:
                self._post(engine_id)
        if release and not active.done.done():
            active.done.set_result(None)

    def release(self, request_id: str) -> None:
        """Let a finished request's ``run`` return (its sequences have left the engine)."""
        self._held.drop(request_id)
        active = self._active.pop(request_id, None)
        for engine_id in active.engine_ids if active is not None else ():
            self._choice_of.pop(engine_id, None)
        if active is not None and not active.done.done():
            active.done.set_result(None)

    def by_lane(self, updates: list[SequenceUpdate]) -> tuple[list[SequenceUpdate], list[SequenceUpdate]]:
        """The step's updates of interactive requests, and those of the batch lane."""
        interactive: list[SequenceUpdate] = []
        batch: list[SequenceUpdate] = []
        for update in updates:
            request_id, _ = self._choice_of.get(update.request_id, ("", 0))
            active = self._active.get(request_id)
            is_batch = active is not None and active.job.lane == Lane.BATCH.value
            (batch if is_batch else interactive).append(update)
        return interactive, batch

    def route(self, updates: list[SequenceUpdate]) -> tuple[list[str], list[tuple[str, TokenEvent]]]:
        """The requests these updates finished, and the events to publish for them."""
        finished: list[str] = []
        events: list[tuple[str, TokenEvent]] = []
        for update in updates:
            request_id, index = self._choice_of.get(update.request_id, ("", 0))
            active = self._active.get(request_id)
            if active is None:
                continue  # aborted while the step ran
            if update.failed:
                events.append((request_id, self._failure(request_id, active)))
                finished.append(request_id)
                continue
            with request_context(request_id):
                produced = active.choices.consume(index, update)
            if produced:
                self._starts.started(request_id)
            if active.job.lane == Lane.BATCH.value:
                events.extend((request_id, event) for event in self._held.take(request_id, produced))
            else:
                events.extend((request_id, event) for event in produced)
            if any(event.type == "choice_finished" for event in produced):
                del self._choice_of[update.request_id]
                if not update.is_finished:
                    self._post(update.request_id)  # a stop sequence ended it; the engine drops it next step
            if produced and produced[-1].type == "finished":
                finished.append(request_id)
        events.extend(self._held.due())
        return finished, events

    def _failure(self, request_id: str, active: _Active) -> Failed:
        """End a request one of whose sequences failed: its other choices leave the engine."""
        logger.warning("request %s failed in the engine; the other requests go on", request_id)
        self._held.drop(request_id)
        for engine_id in active.engine_ids:
            if self._choice_of.pop(engine_id, None) is not None:
                self._post(engine_id)
        return Failed(error=WorkerFailed(MODEL_FAILED).to_info())
