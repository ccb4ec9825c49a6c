"""Gateway request metrics on a toy app: route templates, statuses, 429s, open streams, token timings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.ops.metrics import GatewayMetrics, RequestMetricsMiddleware, note_event, note_model
from shared.protocol import Delta, Finished, FinishReason, Usage
from tests.scrape import Scrape

REQUESTS = "tokenferry_gateway_requests_total"


def _app(metrics: GatewayMetrics, stream_open: asyncio.Event | None = None) -> FastAPI:
    app = FastAPI()
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)

    @app.get("/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        return {"id": item_id}

    @app.get("/limited")
    async def limited() -> JSONResponse:
        return JSONResponse({"error": "slow down"}, status_code=429)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/generate")
    async def generate() -> StreamingResponse:
        note_model("m")

        async def body() -> AsyncIterator[str]:
            for text in ("a", "b", "c"):
                note_event(Delta(text=text, token_ids=[ord(text)]))
                yield f"data: {text}\n\n"
                await asyncio.sleep(0.01)
            if stream_open is not None:
                stream_open.set()
                await asyncio.sleep(0.2)
            usage = Usage(prompt_tokens=1, completion_tokens=3)
            note_event(Finished(finish_reason=FinishReason.STOP, usage=usage))

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


def _client(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def _scrape(metrics: GatewayMetrics) -> Scrape:
    return Scrape.parse(metrics.exposition().decode())


async def test_requests_are_counted_by_route_template_not_raw_path() -> None:
    metrics = GatewayMetrics()
    async with _client(_app(metrics)) as client:
        for item_id in ("a", "b", "c"):
            assert (await client.get(f"/items/{item_id}")).status_code == 200
        assert (await client.get("/nowhere")).status_code == 404
    scrape = _scrape(metrics)
    assert scrape.value(REQUESTS, endpoint="/items/{item_id}", model="", status="200") == 3
    assert scrape.value(REQUESTS, endpoint="unmatched", status="404") == 1
    assert {labels["endpoint"] for labels in scrape.labels_of(REQUESTS)} == {"/items/{item_id}", "unmatched"}


async def test_429s_and_crashes_are_counted() -> None:
    metrics = GatewayMetrics()
    async with _client(_app(metrics)) as client:
        assert (await client.get("/limited")).status_code == 429
        assert (await client.get("/boom")).status_code == 500
    scrape = _scrape(metrics)
    assert scrape.value("tokenferry_gateway_rate_limited_requests_total", endpoint="/limited") == 1
    assert scrape.value(REQUESTS, endpoint="/limited", status="429") == 1
    assert scrape.value(REQUESTS, endpoint="/boom", status="500") == 1


async def test_a_stream_is_open_while_it_is_sent_and_its_tokens_are_timed() -> None:
    metrics = GatewayMetrics()
    stream_open = asyncio.Event()
    async with _client(_app(metrics, stream_open)) as client:
        response = asyncio.create_task(client.get("/generate"))
        await asyncio.wait_for(stream_open.wait(), timeout=5)
        assert _scrape(metrics).value("tokenferry_gateway_open_streams", model="m") == 1
        assert (await response).status_code == 200
    scrape = _scrape(metrics)
    assert scrape.value("tokenferry_gateway_open_streams", model="m") == 0
    assert scrape.value(REQUESTS, endpoint="/generate", model="m", status="200") == 1
    assert scrape.value("tokenferry_gateway_time_to_first_token_seconds_count", model="m") == 1
    # Three tokens, two gaps of at least the 10 ms the body sleeps between them.
    assert scrape.value("tokenferry_gateway_inter_token_latency_seconds_count", model="m") == 2
    assert scrape.value("tokenferry_gateway_inter_token_latency_seconds_sum", model="m") >= 0.02
    assert scrape.value("tokenferry_gateway_e2e_request_latency_seconds_count", model="m") == 1
    assert scrape.value("tokenferry_gateway_e2e_request_latency_seconds_sum", model="m") >= 0.2


async def test_hooks_outside_a_request_do_nothing_and_apps_do_not_share_metrics() -> None:
    note_model("m")
    note_event(Delta(text="x", token_ids=[1]))
    first, second = GatewayMetrics(), GatewayMetrics()
    async with _client(_app(first)) as client:
        await client.get("/items/a")
    assert _scrape(first).value(REQUESTS) == 1
    assert _scrape(second).value(REQUESTS) == 0
