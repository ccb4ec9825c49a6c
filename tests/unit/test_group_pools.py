"""The gateway's pools per model group: a model's pool, and the registry joined across groups."""

from __future__ import annotations

from typing import Any, cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.dispatch.groups import GroupPools
from shared.jobs.arq_seam import QueuePool
from shared.redis_groups import RedisGroups
from shared.registry import WorkerInfo

HOME, OTHER = "redis://home:6379/0", "redis://other:6379/0"


class _Registry:
    """Stands in for a pool: answers the registry's one script with these workers, or fails."""

    def __init__(self, *models: str, failing: bool = False) -> None:
        self.records = [
            WorkerInfo(worker_id=f"{model}-w", model=model, max_model_len=64, started_at=0.0)
            for model in models
        ]
        self.failing = failing
        self.closed = False

    async def eval(self, *args: Any) -> list[bytes]:
        if self.failing:
            raise RedisConnectionError("down")
        return [
            part
            for info in self.records
            for part in (info.worker_id.encode(), info.model_dump_json().encode())
        ]

    async def aclose(self) -> None:
        self.closed = True


def _pools(home: _Registry, other: _Registry) -> GroupPools:
    groups = RedisGroups.of(HOME, {"big*": OTHER})
    return GroupPools(groups, {HOME: cast(QueuePool, home), OTHER: cast(QueuePool, other)})


def test_a_model_gets_its_groups_pool_and_others_the_home_one() -> None:
    home, other = _Registry(), _Registry()
    pools = _pools(home, other)
    assert pools.for_model("big-70b") is other
    assert pools.for_model("small") is home
    assert pools.home is home


async def test_the_registry_is_joined_across_groups() -> None:
    pools = _pools(_Registry("small"), _Registry("big-70b"))
    assert {info.model for info in await pools.live_workers()} == {"small", "big-70b"}


async def test_a_group_that_is_down_is_left_out_but_home_down_fails() -> None:
    assert [
        info.model for info in await _pools(_Registry("small"), _Registry(failing=True)).live_workers()
    ] == ["small"]
    with pytest.raises(RedisConnectionError):
        await _pools(_Registry(failing=True), _Registry("big-70b")).live_workers()


def test_every_group_needs_a_pool() -> None:
    with pytest.raises(ValueError, match="no pool"):
        GroupPools(RedisGroups.of(HOME, {"big*": OTHER}), {HOME: cast(QueuePool, _Registry())})


async def test_closing_closes_the_groups_pools_but_not_the_home_one() -> None:
    home, other = _Registry(), _Registry()
    await _pools(home, other).aclose()
    assert other.closed and not home.closed


def test_without_groups_one_pool_serves_every_model() -> None:
    only = cast(QueuePool, _Registry())
    pools = GroupPools.single(only)
    assert pools.for_model("anything") is only and list(pools.by_url().values()) == [only]
