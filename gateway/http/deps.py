"""Owns what request handlers may depend on: the lifespan's state, the request id, a JSON body.

Handlers declare these as ``Annotated`` aliases and read like what they need
(``request_id: RequestIdDep``); each feature's service is built from them and
offered the same way beside it (``QuotaDep``, ``OpenAIDep``...), so routes never
hold the Redis client themselves. The state is what ``gateway/http/app.py``'s lifespan
built; it is read from ``app.state`` (see the note there on why not from the
per-request copy of the lifespan state).

Every dependency is ``async def``, even one doing no I/O: FastAPI runs a plain
``def`` dependency on its thread pool, which costs each request a thread hop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, TypedDict

from fastapi import Depends, Request

from gateway.access.auth import Authenticator, Principal
from gateway.access.rate_limits import RateLimits
from gateway.access.stream_slots import StreamSlots
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.groups import GroupPools
from gateway.http.auth_gate import principal_of
from gateway.http.request_ids import request_id_of
from gateway.http.unicode_text import check_unicode_text
from shared.errors import PermissionDenied, UnsupportedMediaType
from shared.jobs.arq_seam import QueuePool


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Everything the lifespan opened for the handlers of one gateway process."""

    pool: QueuePool  # the home Redis: tenants' records (``groups.home``)
    dispatcher: Dispatcher
    groups: GroupPools  # a model's Redis: its queue, streams and workers
    authenticator: Authenticator
    rate_limits: RateLimits
    streams: StreamSlots  # the per-tenant cap on open streams
    max_tokens_limit: int | None = None
    max_choices: int = 16  # the operator's max_n
    drain_grace_s: float = 30.0  # how long open streams may run on once the server stops


class LifespanState(TypedDict):
    gateway: GatewayState


def get_state(request: Request) -> GatewayState:
    state = getattr(request.app.state, "gateway", None)
    if not isinstance(state, GatewayState):
        raise RuntimeError("gateway state missing: the app's lifespan did not run")
    return state


async def get_pool(request: Request) -> QueuePool:
    return get_state(request).pool


async def get_request_id(request: Request) -> str:
    request_id = request_id_of(request.scope)
    if request_id is None:
        raise RuntimeError("request id missing: RequestIdMiddleware is not installed")
    return request_id


async def get_principal(request: Request) -> Principal:
    """The authenticated caller (401 when keys are configured and this one is not valid).

    ``AuthGate`` authenticated it before the body was read; only a route the gate
    lets through (an open path) is authenticated here, should it ask who calls.
    """
    found = principal_of(request.scope)
    if found is not None:
        return found
    return await get_state(request).authenticator.authenticate(request.headers.get("authorization"))


async def guard_request(request: Request, principal: Annotated[Principal, Depends(get_principal)]) -> None:
    """Every guarded route: authenticate, then take one unit of the caller's requests-per-minute."""
    await get_state(request).rate_limits.charge_request(principal, request.scope.setdefault("state", {}))


async def get_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.is_admin:
        raise PermissionDenied("This endpoint needs an admin API key.")
    return principal


async def require_json(request: Request) -> None:
    """Refuse bodies not declared as JSON (415) or holding text UTF-8 cannot carry (400)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, not {media_type or 'missing'}.", param="content-type"
        )
    check_unicode_text(await request.body())  # already read (and cached) by FastAPI


PoolDep = Annotated[QueuePool, Depends(get_pool)]
RequestIdDep = Annotated[str, Depends(get_request_id)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
AdminDep = Annotated[Principal, Depends(get_admin)]
JsonBody = Depends(require_json)
