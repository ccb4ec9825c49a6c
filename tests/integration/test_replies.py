"""A tokenize reply that takes longer than one BLPOP slice still arrives."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from shared.jobs import jobqueue, replies
from shared.protocol import Tokenized


async def test_a_reply_slower_than_one_wait_slice_is_still_received(redis_url: str, redis: Redis) -> None:
    pool = await jobqueue.open_pool(redis_url)
    try:
        waiting = asyncio.ensure_future(replies.await_reply(pool, "slow-reply", timeout_s=10))
        await asyncio.sleep(2.5)  # longer than a one-second slice
        await replies.send_reply(redis, "slow-reply", Tokenized(tokens=[1, 2], text="hi", max_model_len=8))
        reply = await asyncio.wait_for(waiting, timeout=5)
    finally:
        await pool.aclose()
    assert reply == Tokenized(tokens=[1, 2], text="hi", max_model_len=8)
