"""Shared fixtures: one real redis-server per session on a free port, a clean database per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from shared.redis_server import EmbeddedRedis

# vLLM's engine is an optional backend with a venv of its own: ``make test-vllm`` sets this and
# runs tests/vllm there (and the engine contract against it); ``make test`` never imports vLLM.
VLLM_TESTS = os.environ.get("TOKENFERRY_TEST_VLLM") == "1"
collect_ignore = [] if VLLM_TESTS else ["vllm"]
# CUDA graphs need a GPU: ``make test-gpu`` runs tests/gpu where one is; ``make test`` leaves it out.
if os.environ.get("TOKENFERRY_TEST_GPU") != "1":
    collect_ignore.append("gpu")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()
