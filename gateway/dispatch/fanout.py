"""Owns answering one request with several jobs: a completions request that lists several prompts.

Each prompt runs as its own job (``{request_id}-p{j}``, see ``translate.completion_jobs``),
so each is submitted, streamed, aborted and taken over like any request. Here they
are submitted together, and their events merged into one response:

* submitting is all or nothing: the first refusal (a prompt too long, say) aborts
  the jobs already accepted and is raised, so the client gets one 4xx;
* their ``Accepted`` events come first, in prompt order (``gateway/openai/render.py``
  relies on it to know which prompt's text to echo), then all events as they
  arrive, interleaved, each ``Delta``/``ChoiceFinished`` re-indexed to OpenAI's
  choice index ``prompt_index * n + i``;
* leaving early (the client went, one job failed) cancels every relay, and each
  relay aborts its own job.

Intentional divergence: a merged stream carries no SSE ids. An id names a place in
one request's stream, and a merged stream is several; a client reconnecting with
``Last-Event-ID`` can resume a single-prompt stream only. One prompt never gets
here at all: it keeps the ordinary, resumable path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Sequence
from contextlib import aclosing
from typing import TypeVar

import anyio

from gateway.dispatch.dispatcher import Acceptance, Dispatcher
from shared.jobs.streams import StreamEvent
from shared.protocol import ChoiceFinished, Delta, GenerationJob, TokenEvent

_T = TypeVar("_T")
_MERGED_ENTRY_ID = ""  # see the module docstring: merged events have no resumable id


async def collect_all(dispatcher: Dispatcher, jobs: Sequence[GenerationJob]) -> list[list[TokenEvent]]:
    """Every job's events (Accepted ... Finished), in job order."""
    return await _all([dispatcher.collect(job) for job in jobs])


async def submit_all(dispatcher: Dispatcher, jobs: Sequence[GenerationJob]) -> list[Acceptance]:
    """Submit every job, or none: a refusal aborts the jobs already accepted, then is raised."""
    tasks = [asyncio.ensure_future(dispatcher.submit(job)) for job in jobs]
    try:
        return await _all(tasks)
    except BaseException:
        for task, job in zip(tasks, jobs, strict=True):
            if task.done() and not task.cancelled() and task.exception() is None:
                await dispatcher.abort(
                    job.request_id, model=job.model, reason="another prompt of the request failed"
                )
        raise


def relay_all(
    dispatcher: Dispatcher, acceptances: Sequence[Acceptance], choices_per_prompt: int
) -> AsyncGenerator[StreamEvent, None]:
    """The events after the first job's ``Accepted``: one job's own relay, or the merge of several."""
    if len(acceptances) == 1:
        return dispatcher.relay(acceptances[0])
    return _merged(dispatcher, acceptances, choices_per_prompt)


async def _merged(
    dispatcher: Dispatcher, acceptances: Sequence[Acceptance], choices_per_prompt: int
) -> AsyncGenerator[StreamEvent, None]:
    for acceptance in acceptances[1:]:
        yield StreamEvent(_MERGED_ENTRY_ID, acceptance.accepted.event)
    queue: asyncio.Queue[tuple[int, StreamEvent] | Exception | None] = asyncio.Queue()
    pumps = [
        asyncio.ensure_future(_pump(dispatcher, acceptance, prompt_index, queue))
        for prompt_index, acceptance in enumerate(acceptances)
    ]
    try:
        running = len(pumps)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                prompt_index, event = item
                yield StreamEvent(_MERGED_ENTRY_ID, reindexed(event.event, prompt_index * choices_per_prompt))
    finally:
        for pump in pumps:
            pump.cancel()
        # Shielded: sse-starlette cancels through anyio scopes, and each relay must get to abort its job.
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(
    dispatcher: Dispatcher,
    acceptance: Acceptance,
    prompt_index: int,
    queue: asyncio.Queue[tuple[int, StreamEvent] | Exception | None],
) -> None:
    """Move one job's relayed events into the merge's queue; None marks its end, an exception its failure."""
    try:
        async with aclosing(dispatcher.relay(acceptance)) as events:
            async for item in events:
                await queue.put((prompt_index, item))
    except Exception as error:
        await queue.put(error)
        return
    await queue.put(None)


def reindexed(event: TokenEvent, offset: int) -> TokenEvent:
    """``event`` with its choice index moved by ``offset`` (its prompt's first choice index)."""
    if offset and isinstance(event, Delta | ChoiceFinished):
        return event.model_copy(update={"index": event.index + offset})
    return event


async def _all(work: Sequence[Awaitable[_T]]) -> list[_T]:
    """Await all of ``work``; the first failure (or our cancellation) cancels the rest, which are awaited."""
    tasks = [asyncio.ensure_future(item) for item in work]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        if not all(task.done() for task in tasks):
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
    for task in tasks:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error
    return [task.result() for task in tasks]
