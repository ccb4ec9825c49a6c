"""The gateway's uvicorn runs uvloop and httptools: both installed, both names uvicorn knows."""

from __future__ import annotations

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cli import GATEWAY_EVENT_LOOP, GATEWAY_HTTP


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("never called")


def test_the_gateway_server_uses_httptools() -> None:
    config = uvicorn.Config(_app, loop=GATEWAY_EVENT_LOOP, http=GATEWAY_HTTP, log_config=None)
    config.load()
    assert config.http_protocol_class is HttpToolsProtocol


def test_the_gateway_server_runs_on_uvloop() -> None:
    import uvloop

    config = uvicorn.Config(_app, loop=GATEWAY_EVENT_LOOP, http=GATEWAY_HTTP, log_config=None)
    factory = config.get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
