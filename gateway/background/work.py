"""Owns the gateway's background work: the file, batch and response stores and the runner driving them.

``running(app, settings, groups)`` is entered by the lifespan (``gateway/http/app.py``):
it builds the stores, starts this gateway's ``Runner`` as a task it owns, and
stops it on the way out (the runner gives its leases back, so another gateway
continues at once). Handlers reach the stores through the ``Annotated`` aliases
below; they live on ``app.state.background``, beside the gateway state and for
the same reason (see ``gateway/http/app.py``). The stores and the runner's leases
live in the home Redis; the jobs they run, in their model's group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from gateway.background.runner import Driver, GiveUp, Runner
from gateway.batches.batch_end import BatchContext, give_up_batch
from gateway.batches.files import FileQuota, FileStore
from gateway.batches.run import run_batch
from gateway.batches.store import BatchStore
from gateway.dispatch.groups import GroupPools
from gateway.responses_api.store import ResponseStore
from shared.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class Background:
    files: FileStore
    batches: BatchStore
    responses: ResponseStore
    max_file_bytes: int
    file_quota: FileQuota


def build_background(settings: GatewaySettings, groups: GroupPools) -> tuple[Background, Runner]:
    """The stores and the runner of one gateway process."""
    pool = groups.home
    files = FileStore(pool, settings.result_retention_s)
    batches = BatchStore(pool, settings.result_retention_s)
    responses = ResponseStore(pool, groups, settings.result_retention_s)
    context = BatchContext(
        pool,
        groups,
        batches,
        files,
        max_inflight=settings.batch_max_inflight,
        max_tokens_limit=settings.max_tokens_limit,
        max_n=settings.max_n,
    )
    drivers: dict[str, Driver] = {"batch": partial(run_batch, context), "response": responses.drive}
    give_ups: dict[str, GiveUp] = {"batch": partial(give_up_batch, context)}
    runner = Runner(pool, drivers, give_ups=give_ups)
    file_quota = FileQuota(settings.max_files_per_tenant, settings.max_file_bytes_per_tenant)
    return Background(files, batches, responses, settings.max_file_bytes, file_quota), runner


@contextlib.asynccontextmanager
async def running(app: FastAPI, settings: GatewaySettings, groups: GroupPools) -> AsyncIterator[Background]:
    """Serve the stores and run the runner while the app runs."""
    background, runner = build_background(settings, groups)
    app.state.background = background
    task = asyncio.create_task(runner.run())
    try:
        yield background
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        del app.state.background


async def get_background(request: Request) -> Background:
    background = getattr(request.app.state, "background", None)
    if not isinstance(background, Background):
        raise RuntimeError("background state missing: the app's lifespan did not run")
    return background


BackgroundDep = Annotated[Background, Depends(get_background)]
