"""Owns what request handlers may depend on: the lifespan's state, the request id, a JSON body.

Handlers declare these as ``Annotated`` aliases and read like what they need
(``dispatcher: DispatcherDep``). The state is what ``gateway/app.py``'s lifespan
built; it is read from ``app.state`` (see the note there on why not from the
per-request copy of the lifespan state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, TypedDict

from arq.connections import ArqRedis
from fastapi import Depends, Request

from gateway.dispatch import Dispatcher
from gateway.request_ids import request_id_of
from shared.errors import UnsupportedMediaType


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Everything the lifespan opened for the handlers of one gateway process."""

    pool: ArqRedis
    dispatcher: Dispatcher


class LifespanState(TypedDict):
    gateway: GatewayState


def get_state(request: Request) -> GatewayState:
    state = getattr(request.app.state, "gateway", None)
    if not isinstance(state, GatewayState):
        raise RuntimeError("gateway state missing: the app's lifespan did not run")
    return state


def get_pool(request: Request) -> ArqRedis:
    return get_state(request).pool


def get_dispatcher(request: Request) -> Dispatcher:
    return get_state(request).dispatcher


def get_request_id(request: Request) -> str:
    request_id = request_id_of(request.scope)
    if request_id is None:
        raise RuntimeError("request id missing: RequestIdMiddleware is not installed")
    return request_id


def require_json(request: Request) -> None:
    """Refuse bodies that are not declared as JSON (415), before they are validated as such."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, not {media_type or 'missing'}.", param="content-type"
        )


PoolDep = Annotated[ArqRedis, Depends(get_pool)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]
RequestIdDep = Annotated[str, Depends(get_request_id)]
JsonBody = Depends(require_json)
