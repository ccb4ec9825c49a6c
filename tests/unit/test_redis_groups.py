"""Model groups: which Redis a model's keys live in, their precedence, and bad settings refused at start."""

from __future__ import annotations

import argparse
import inspect
import json
from typing import Any

import pytest
from pydantic import ValidationError

from cli import options
from shared import keys
from shared.redis_groups import RedisGroups, RedisGroupsError, check_redis_groups
from shared.settings import GatewaySettings, WorkerSettings

HOME = "redis://home:6379/0"
BIG = "redis://big:6379/0"
QWEN = "redis+sentinel://s1:26379,s2/qwen"


def groups(**mapping: str) -> RedisGroups:
    return RedisGroups.of(HOME, mapping)


def test_a_model_no_pattern_matches_lives_in_the_home_redis() -> None:
    assert groups(**{"llama-70b": BIG}).url_for("smol") == HOME
    assert RedisGroups.of(HOME, {}).url_for("anything") == HOME


def test_an_exact_name_beats_every_glob_whatever_the_order() -> None:
    resolved = RedisGroups.of(HOME, {"qwen*": QWEN, "*": BIG, "qwen-7b": HOME})
    assert resolved.url_for("qwen-7b") == HOME
    assert resolved.url_for("qwen-14b") == QWEN


def test_among_globs_the_first_written_wins() -> None:
    assert RedisGroups.of(HOME, {"qwen*": QWEN, "*-7b": BIG}).url_for("qwen-7b") == QWEN
    assert RedisGroups.of(HOME, {"*-7b": BIG, "qwen*": QWEN}).url_for("qwen-7b") == BIG


def test_globs_match_the_whole_name_case_sensitively_slashes_included() -> None:
    resolved = groups(**{"Qwen/*": QWEN, "llama-?b": BIG})
    assert resolved.url_for("Qwen/Qwen2-0.5B") == QWEN
    assert resolved.url_for("qwen/qwen2") == HOME
    assert resolved.url_for("llama-8b") == BIG
    assert resolved.url_for("llama-70b") == HOME


def test_urls_are_distinct_with_home_first() -> None:
    resolved = RedisGroups.of(HOME, {"a": BIG, "b*": BIG, "c": QWEN, "d": HOME})
    assert resolved.urls() == (HOME, BIG, QWEN)
    assert resolved.is_grouped
    assert not RedisGroups.of(HOME, {"a": HOME}).is_grouped


@pytest.mark.parametrize(
    ("mapping", "says"),
    [
        ({"": BIG}, "non-empty"),
        ({" qwen*": BIG}, "non-empty"),
        ({"qwen*": "http://big:6379"}, "must start with redis://"),
        ({"qwen*": "redis+sentinel://s1:26379"}, "bad Sentinel URL"),
    ],
)
def test_bad_patterns_and_urls_are_refused_naming_the_setting(mapping: dict[str, str], says: str) -> None:
    with pytest.raises(RedisGroupsError, match="--redis-groups") as error:
        check_redis_groups(mapping)
    assert says in str(error.value)


def test_bad_groups_fail_the_settings_at_start_up() -> None:
    with pytest.raises(ValidationError, match="--redis-groups"):
        GatewaySettings(redis_groups={"m": "tcp://nowhere"})


def test_a_password_in_a_refused_url_is_masked() -> None:
    with pytest.raises(RedisGroupsError) as error:
        check_redis_groups({"m": "redis+sentinel://:hunter2@s1/"})
    assert "hunter2" not in str(error.value)


def test_a_worker_uses_its_models_group_for_everything() -> None:
    worker = WorkerSettings(model="qwen-7b", redis_url=HOME, redis_groups={"qwen*": QWEN})
    assert worker.model_redis_url == QWEN
    assert WorkerSettings(model="smol", redis_url=HOME, redis_groups={"qwen*": QWEN}).model_redis_url == HOME


def test_a_worker_whose_names_span_two_groups_is_refused_at_start_up() -> None:
    with pytest.raises(ValidationError, match="all fall in one group"):
        WorkerSettings(
            model="dir", served_model_name=["qwen-7b", "fast"], redis_url=HOME, redis_groups={"qwen*": QWEN}
        )
    aliases_too = WorkerSettings(
        model="dir", served_model_name=["qwen-7b", "qwen-fast"], redis_url=HOME, redis_groups={"qwen*": QWEN}
    )
    assert aliases_too.model_redis_url == QWEN


def test_the_setting_is_read_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENFERRY_REDIS_GROUPS", json.dumps({"qwen*": QWEN, "big": BIG}))
    assert GatewaySettings().model_groups().url_for("big") == BIG
    assert list(GatewaySettings().redis_groups) == ["qwen*", "big"]  # the order written is kept


def test_the_flag_takes_a_yaml_mapping() -> None:
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    flags = options.add_settings_flags(parser, [GatewaySettings])
    given = options.given(
        parser.parse_args(["--redis-groups", "{'qwen*': redis://q:6379/0}"]), [*flags.values()]
    )
    assert GatewaySettings(**given).model_groups().url_for("qwen-7b") == "redis://q:6379/0"


def _key_names() -> set[str]:
    """Every key function and key constant ``shared/keys.py`` defines."""
    helpers = {"request_id_of_job", "attempt_job_id"}  # ids, not keys
    functions = {
        name
        for name, value in vars(keys).items()
        if inspect.isfunction(value) and value.__module__ == keys.__name__ and name not in helpers
    }
    constants = {name for name, value in vars(keys).items() if _is_key_constant(name, value)}
    return functions | constants


def _is_key_constant(name: str, value: Any) -> bool:
    return (
        name.isupper()
        and isinstance(value, str)
        and value.startswith(("arq:", keys.PREFIX))
        and name != "PREFIX"
    )


def test_every_key_lives_on_one_side_home_or_its_models_group() -> None:
    assert _key_names() == set(keys.SIDES)
    assert keys.SIDES["queue"] is keys.Side.GROUP
    assert keys.SIDES["api_key"] is keys.Side.HOME
    assert keys.SIDES["request_view"] is keys.Side.HOME  # how a resume finds the group
