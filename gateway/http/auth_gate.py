"""Owns authentication before the body: every guarded request is authenticated from its headers alone.

``AuthGate`` sits outside the body limit, which buffers the whole body: a caller
without a valid key is answered 401 before one byte of its body is read, however
large it says it is (an upload included). The gate is an allowlist: only the paths
it is given as open (the probes, and ``/metrics`` or the API docs where their
settings open them) pass without a key; everything else, unknown paths included,
is authenticated. The principal it found is kept in the request's scope state,
where ``gateway/http/deps.py``'s ``get_principal`` reads it, so a request is
authenticated once.

Refusals answer in the shape the route's clients read: OpenAI's envelope, or
TGI's for TGI's paths (``error_renderer``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.access.auth import Authenticator, Principal
from gateway.http.asgi import HttpMiddleware
from gateway.http.errors import error_response, to_domain_error
from gateway.http.request_ids import request_id_of
from shared.errors import TokenferryError

PRINCIPAL_STATE = "principal"
ErrorRenderer = Callable[[TokenferryError, str | None], Response]


class AuthGate(HttpMiddleware):
    """Authenticate every request outside ``open_paths`` before the app (and its body) runs.

    ``error_renderers`` names the paths whose refusals use another error shape than OpenAI's.
    """

    def __init__(
        self,
        app: ASGIApp,
        open_paths: Collection[str],
        error_renderers: dict[str, ErrorRenderer] | None = None,
    ) -> None:
        super().__init__(app)
        self.open_paths = frozenset(open_paths)
        self.error_renderers = error_renderers or {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        try:
            principal = await _authenticator(scope).authenticate(Headers(scope=scope).get("authorization"))
        except Exception as exc:  # a refusal, or Redis failing: answered here, the body still unread
            render = self.error_renderers.get(scope["path"], error_response)
            await render(to_domain_error(exc), request_id_of(scope))(scope, receive, send)
            return
        remember_principal(scope, principal)
        await self.app(scope, receive, send)


def remember_principal(scope: Scope, principal: Principal) -> None:
    scope.setdefault("state", {})[PRINCIPAL_STATE] = principal


def principal_of(scope: Scope) -> Principal | None:
    """The principal the gate found for this request (None where no gate ran)."""
    found = scope.get("state", {}).get(PRINCIPAL_STATE)
    return found if isinstance(found, Principal) else None


def _authenticator(scope: Scope) -> Authenticator:
    state: Any = getattr(scope["app"].state, "gateway", None)
    authenticator = getattr(state, "authenticator", None)
    if not isinstance(authenticator, Authenticator):
        raise RuntimeError("gateway state missing: the app's lifespan did not run")
    return authenticator
