"""Owns compare-and-set status changes of records kept as Redis hashes (batches, responses).

A status may be changed by two parties at once (a client's cancel, a runner's
completion); one Lua script makes "change it only from these statuses" one atomic
step, so exactly one of them wins and the loser sees it lost.
"""

from __future__ import annotations

from collections.abc import Mapping

from redis.asyncio import Redis

# KEYS[1]: the hash. ARGV: the new status, how many statuses it may come from, those
# statuses, then field/value pairs set with it. Returns 1 when it changed.
_SCRIPT = """
local current = redis.call('HGET', KEYS[1], 'status')
local allowed = tonumber(ARGV[2])
for i = 3, 2 + allowed do
  if current == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1])
    for j = 3 + allowed, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 1]) end
    return 1
  end
end
return 0
"""


class StatusCas:
    """Status changes of one record family (one registered script)."""

    def __init__(self, redis: Redis) -> None:
        self._script = redis.register_script(_SCRIPT)

    async def change(
        self, key: str, to: str, allowed: tuple[str, ...], fields: Mapping[str, str | int | float]
    ) -> bool:
        """Set ``status`` to ``to`` with ``fields``, only while it is one of ``allowed``."""
        args: list[str | int | float] = [to, len(allowed), *allowed]
        for name, value in fields.items():
            args += [name, value]
        return bool(await self._script(keys=[key], args=args))
