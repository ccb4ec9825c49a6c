"""Owns which Redis a model's traffic lives in: the model groups of ``--redis-groups``.

A deployment outgrows one Redis by giving groups of models a Redis of their own
(``docs/deployment.md``, "Past one Redis", says why not Redis Cluster). The setting
maps a model name, or a glob of names (``fnmatch``: ``*``, ``?``, ``[...]``), to a
Redis URL of either accepted form (``shared/redis_url.py``)::

    redis_groups:
      llama-3-70b: redis://redis-70b:6379/0
      "qwen*": redis+sentinel://s1:26379,s2:26379/qwen

Everything of one model (its queues, event streams, run records, aborts, replies
and its workers' registry: ``Side.GROUP`` in ``keys.SIDES``) lives in its group's
Redis; what belongs to tenants, not models (API keys, rate limits, files, batches,
stored responses, resumable stream views: ``Side.HOME``) stays in ``--redis-url``,
the home Redis. A model no pattern matches is served from home, so without the setting
nothing changes.

Precedence: a pattern without glob characters (a model's own name) beats every
glob; among globs the first written wins (YAML and JSON keep their order), as in
an nginx ``location`` list. Bad patterns and URLs are refused at start-up, naming
the setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from shared import redis_url
from shared.redis_url import RedisUrlError, check_redis_url, redacted_url

SETTING = "--redis-groups (TOKENFERRY_REDIS_GROUPS)"
_GLOB_CHARACTERS = frozenset("*?[")


class RedisGroupsError(ValueError):
    """``--redis-groups`` is malformed, or a worker's names fall in several groups."""


def is_glob(pattern: str) -> bool:
    return not _GLOB_CHARACTERS.isdisjoint(pattern)


def check_redis_groups(groups: Mapping[str, str]) -> dict[str, str]:
    """``groups`` unchanged if every pattern and URL is acceptable, else ``RedisGroupsError``."""
    for pattern, url in groups.items():
        if not pattern.strip() or pattern != pattern.strip():
            raise RedisGroupsError(f"{SETTING}: a model pattern must be a non-empty name, got {pattern!r}")
        try:
            check_redis_url(url)
        except RedisUrlError as error:
            why = str(error).removeprefix(redis_url.SETTING).lstrip(": ")
            raise RedisGroupsError(
                f"{SETTING}: the URL of {pattern!r} ({redacted_url(url)!r}) is not accepted: {why}"
            ) from error
    return dict(groups)


@dataclass(frozen=True, slots=True)
class RedisGroups:
    """The home Redis and the model groups; ``url_for`` says where one model's keys live."""

    home_url: str
    exact: Mapping[str, str]  # a model's own name -> its group's URL
    globs: tuple[tuple[str, str], ...]  # (glob, URL), in the order written: the first match wins

    @classmethod
    def of(cls, home_url: str, groups: Mapping[str, str]) -> RedisGroups:
        """The groups of a checked ``redis_groups`` setting around the home ``redis_url``."""
        checked = check_redis_groups(groups)
        return cls(
            home_url=home_url,
            exact={pattern: url for pattern, url in checked.items() if not is_glob(pattern)},
            globs=tuple((pattern, url) for pattern, url in checked.items() if is_glob(pattern)),
        )

    @property
    def is_grouped(self) -> bool:
        """Whether any model lives outside the home Redis."""
        return any(url != self.home_url for url in self.urls())

    def url_for(self, model: str) -> str:
        """The URL of the Redis holding ``model``'s queues, streams and registry."""
        if model in self.exact:
            return self.exact[model]
        return next((url for glob, url in self.globs if fnmatchcase(model, glob)), self.home_url)

    def url_for_names(self, names: Iterable[str]) -> str:
        """The one group of a worker answering to ``names`` (its model and its aliases).

        A gateway finds a request's group by the name it asks for, so every name of a worker
        must lead to the same Redis; one that does not is refused at the worker's start.
        """
        found = {name: self.url_for(name) for name in names}
        urls = set(found.values())
        if len(urls) > 1:
            where = ", ".join(f"{name} -> {redacted_url(url)}" for name, url in found.items())
            raise RedisGroupsError(
                f"{SETTING}: a worker's served names must all fall in one group, but {where}"
            )
        return urls.pop() if urls else self.home_url

    def urls(self) -> tuple[str, ...]:
        """Every distinct Redis URL, the home one first."""
        return tuple(dict.fromkeys([self.home_url, *self.exact.values(), *(url for _, url in self.globs)]))
