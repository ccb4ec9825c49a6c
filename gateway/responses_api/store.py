"""Owns background responses in Redis: their records and the driver that completes them.

A background response is answered at once (``queued``) and its job runs like any
other; the result must not depend on the client polling in time, because a job's
event stream expires ``keys.EVENTS_TTL_S`` after its end. So each one is listed
as active work and driven by ``gateway/background/runner.py`` (from whichever gateway holds
its lease): the driver watches the last event of the job's stream and, once it
ends, folds the events into the finished response and stores it for the
retention time. Status changes are compare-and-set (``gateway/background/status_cas.py``),
so a cancel and a completion racing each other leave one answer.

A foreground response is stored once it has ended (unless asked ``store: false``),
for the retention time, so it too can be retrieved and continued. Each record
keeps the conversation the response answered (without its ``instructions``, which
OpenAI does not carry over); ``history`` is that conversation followed by the
response's output, for a request naming it as ``previous_response_id``. Its owner is
recorded like every resource's, and another tenant's id is as unknown as a made-up one.

Records live in the home Redis; a response's job and event stream are in its model's
group (``gateway/dispatch/groups.py``), found by the model the record names.
"""

from __future__ import annotations

import asyncio
import time

from pydantic import TypeAdapter
from redis.asyncio import Redis

from gateway.background.status_cas import StatusCas
from gateway.dispatch.groups import GroupPools
from gateway.responses_api.conversation import chat_messages
from gateway.responses_api.objects import CONTINUABLE_STATUSES, TERMINAL_RESPONSE_STATUSES, Response
from gateway.responses_api.render import finished_response
from shared import keys
from shared.access.ownership import ResourceKind, is_owned_by, record_owner
from shared.codec import decode_event
from shared.errors import InvalidRequest, NotFound
from shared.jobs.streams import EventReader
from shared.protocol import TERMINAL_EVENT_TYPES, ChatMessage

ACTIVE_KIND = "response"
# A background response may wait and run this long before its record is at risk.
RUNNING_TTL_S = 24 * 3600
_OPEN = ("queued", "in_progress")
_MESSAGES = TypeAdapter(list[ChatMessage])


class ResponseStore:
    """Stored responses of all tenants; one per gateway process."""

    def __init__(self, redis: Redis, groups: GroupPools, retention_s: int, tick_s: float = 0.2) -> None:
        self._redis = redis
        self._groups = groups
        self._retention_s = retention_s
        self._tick_s = tick_s
        self._status = StatusCas(redis)

    async def create(
        self, tenant: str, response: Response, request_id: str, conversation: list[ChatMessage]
    ) -> None:
        """Store a queued background response, answering ``conversation``, and list it for a runner."""
        await self._put(tenant, response, request_id, conversation, RUNNING_TTL_S + self._retention_s)

    async def save(
        self, tenant: str, response: Response, request_id: str, conversation: list[ChatMessage]
    ) -> None:
        """Store a foreground response that has ended, for the retention time."""
        assert response.status in TERMINAL_RESPONSE_STATUSES
        await self._put(tenant, response, request_id, conversation, self._retention_s)

    async def _put(
        self, tenant: str, response: Response, request_id: str, conversation: list[ChatMessage], ttl_s: int
    ) -> None:
        key = keys.response(response.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={
                    "status": response.status,
                    "record": response.model_dump_json(),
                    "request_id": request_id,
                    "conversation": _MESSAGES.dump_json(conversation),
                },
            )
            pipe.expire(key, ttl_s)
            if response.status in _OPEN:
                pipe.sadd(keys.active(ACTIVE_KIND), response.id)
            await pipe.execute()
        await record_owner(self._redis, ResourceKind.RESPONSE, response.id, tenant, ttl_s)

    async def history(self, response_id: str, tenant: str) -> list[ChatMessage]:
        """The conversation a response named by ``previous_response_id`` continues: what it answered,
        then its output. Unknown, expired or another tenant's: 404; not finished or failed: 400."""
        key = keys.response(response_id)
        record, conversation = await self._redis.hmget(key, ["record", "conversation"])  # type: ignore[misc]
        if record is None or not await is_owned_by(self._redis, ResourceKind.RESPONSE, response_id, tenant):
            raise NotFound(
                f"Previous response with id '{response_id}' not found.", param="previous_response_id"
            )
        response = Response.model_validate_json(record)
        if response.status not in CONTINUABLE_STATUSES:
            raise InvalidRequest(
                f"Previous response '{response_id}' is {response.status}; only a completed or "
                "incomplete response can be continued.",
                param="previous_response_id",
            )
        earlier = _MESSAGES.validate_json(conversation) if conversation is not None else []
        return [*earlier, *chat_messages(response.output, earlier)]

    async def get(self, response_id: str) -> Response | None:
        raw = await self._redis.hget(keys.response(response_id), "record")  # type: ignore[misc]
        return None if raw is None else Response.model_validate_json(raw)

    async def cancel(self, response_id: str) -> Response | None:
        """Cancel an unfinished response; the response as it then stands (None: unknown)."""
        current = await self.get(response_id)
        if current is None:
            return None
        cancelled = current.model_copy(update={"status": "cancelled", "completed_at": time.time()})
        if await self._settle(response_id, cancelled):
            return cancelled
        return await self.get(response_id)

    async def drive(self, response_id: str) -> None:
        """Watch the job's stream until it ends and store the finished response (the runner's driver)."""
        request_id = await self._redis.hget(keys.response(response_id), "request_id")  # type: ignore[misc]
        while (current := await self.get(response_id)) is not None and current.status in _OPEN:
            events_redis = self._groups.for_model(current.model)
            last = await events_redis.xrevrange(keys.events(_text(request_id)), count=1)
            if last and decode_event(last[0][1]).type in TERMINAL_EVENT_TYPES:
                history = await EventReader(events_redis).history(_text(request_id))
                events = [item.event for item in history]
                await self._settle(
                    response_id,
                    finished_response(current, events, _text(request_id), time.time()),
                )
            elif last and current.status == "queued":
                running = current.model_copy(update={"status": "in_progress"})
                await self._status.change(
                    keys.response(response_id), "in_progress", ("queued",), _record(running)
                )
            await asyncio.sleep(self._tick_s)
        await self._redis.srem(keys.active(ACTIVE_KIND), response_id)  # type: ignore[misc]

    async def _settle(self, response_id: str, final: Response) -> bool:
        """Store ``final`` unless the response already ended; then keep it for the retention time."""
        assert final.status in TERMINAL_RESPONSE_STATUSES
        changed = await self._status.change(keys.response(response_id), final.status, _OPEN, _record(final))
        if changed:
            await self._redis.expire(keys.response(response_id), self._retention_s)
            await self._redis.srem(keys.active(ACTIVE_KIND), response_id)  # type: ignore[misc]
        return changed

    async def request_id(self, response_id: str) -> str | None:
        raw = await self._redis.hget(keys.response(response_id), "request_id")  # type: ignore[misc]
        return None if raw is None else _text(raw)

    async def has_events(self, request_id: str, model: str) -> bool:
        """Whether the job's event stream is still kept (it expires after its end)."""
        return bool(await self._groups.for_model(model).exists(keys.events(request_id)))


def _record(response: Response) -> dict[str, str]:
    return {"record": response.model_dump_json()}


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
