"""``ended_requests``: which of many streams end with a terminal event, read in one script."""

from __future__ import annotations

from redis.asyncio import Redis

from shared.errors import WorkerFailed
from shared.jobs.streams import EventWriter, ended_requests
from shared.protocol import Accepted, Delta, Failed, Finished, FinishReason, Usage


async def test_only_streams_ending_with_finished_or_failed_count_as_ended(redis: Redis) -> None:
    writer = EventWriter(redis)
    done = Finished(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=1, completion_tokens=1))
    await writer.publish_step(
        [
            ("running", Accepted(prompt_tokens=1, worker_id="w")),
            # Text that spells a terminal type must not fool the check.
            ("running", Delta(text='{"type":"finished"} "type":"failed"', token_ids=[1])),
            ("finished", Accepted(prompt_tokens=1, worker_id="w")),
            ("finished", done),
            ("failed", Failed(error=WorkerFailed("boom").to_info())),
        ]
    )
    asked = ["running", "finished", "failed", "never-started"]
    assert await ended_requests(redis, asked) == {"finished", "failed"}
    assert await ended_requests(redis, []) == set()
