"""Owns what every settings model shares: its sources, their precedence, and the field metadata.

Precedence, highest first, written once here:
  1. the request's own fields (applied by the worker, see ``worker/requests/params.py``)
  2. command-line flags (passed to the settings as init values)
  3. ``TOKENFERRY_*`` environment variables (``__`` separates nested keys)
  4. the YAML file named by ``--config`` / ``TOKENFERRY_CONFIG``
  5. the model's ``generation_config.json``
  6. library defaults (the field defaults, then transformers')

Help groups and other flag names are field metadata (``json_schema_extra``), so the
command line (``cli/options.py``) and the configuration reference (``cli/reference.py``)
are generated from the same fields the environment and the YAML file fill.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from shared.redis_groups import RedisGroups, check_redis_groups
from shared.redis_url import check_redis_url

ENV_PREFIX = "TOKENFERRY_"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]

# The help groups of the flags and the sections of the configuration reference, in order.
GROUPS = (
    "Model", "Engine", "Scheduling", "Generation defaults", "Server", "Redis", "Security", "Limits",
    "Observability", "Configuration", "Testing",
)  # fmt: skip


def _group(name: str) -> Any:
    """A field's help group, as ``Annotated`` metadata (pydantic merges it into the field)."""
    assert name in GROUPS, name
    return Field(json_schema_extra={"group": name})


MODEL = _group("Model")
ENGINE = _group("Engine")
SCHEDULING = _group("Scheduling")
GENERATION = _group("Generation defaults")
SERVER = _group("Server")
REDIS = _group("Redis")
SECURITY = _group("Security")
LIMITS = _group("Limits")
OBSERVABILITY = _group("Observability")
CONFIGURATION = _group("Configuration")
TESTING = _group("Testing")


def cli(
    *aliases: str,
    deprecated: str | None = None,
    metavar: str | None = None,
    many: bool = False,
    synonyms: dict[str, str] | None = None,
) -> Any:
    """A field's command-line metadata beyond its name, type, description and group.

    ``aliases``: other names of the flag (kept from before, or vLLM's for the same meaning);
    ``deprecated``: a name still accepted with a warning; ``many``: a list flag taking several
    values at once (``--served-model-name a b``) rather than one per use; ``synonyms``: other
    accepted values and what they mean (``--dtype half``).
    """
    extra: dict[str, Any] = {"aliases": list(aliases)}
    optional = {"deprecated_alias": deprecated, "metavar": metavar, "many": many, "synonyms": synonyms}
    extra.update({key: value for key, value in optional.items() if value})
    return extra


def renamed(field: str, old: str) -> AliasChoices:
    """Read a renamed field under its old YAML key and environment variable too."""
    return AliasChoices(field, old, f"{ENV_PREFIX}{field.upper()}", f"{ENV_PREFIX}{old.upper()}")


def split_commas(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class YamlFromConfigFile(PydanticBaseSettingsSource):
    """Reads the YAML file whose path came from the init values or the environment."""

    def __init__(self, settings_cls: type[BaseSettings], init: InitSettingsSource) -> None:
        super().__init__(settings_cls)
        self._init = init

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole mapping

    def __call__(self) -> dict[str, Any]:
        path = (
            self._init.init_kwargs.get("config_file")
            or os.environ.get(f"{ENV_PREFIX}CONFIG_FILE")
            or os.environ.get(f"{ENV_PREFIX}CONFIG")
        )
        if not path:
            return {}
        if not Path(path).is_file():
            raise ValueError(f"config file {path} does not exist")
        return YamlConfigSettingsSource(self.settings_cls, yaml_file=Path(path))()


class TokenferrySettings(BaseSettings):
    """What every tokenferry process reads: the config file, Redis and logging."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore", frozen=True
    )

    config_file: Annotated[Path | None, CONFIGURATION] = Field(
        None,
        description="YAML file with the same keys as the flags (also read from TOKENFERRY_CONFIG).",
        json_schema_extra=cli("--config", metavar="FILE.yaml"),
    )
    redis_url: Annotated[str, REDIS] = Field(
        DEFAULT_REDIS_URL,
        description=(
            "redis://, rediss:// or unix:// URL shared by all processes, or"
            " redis+sentinel://[:password@]host1:port1[,host2:port2]/service_name[/db]"
            " to follow the primary through Redis Sentinel (the password is the data nodes')."
        ),
        json_schema_extra=cli(metavar="URL"),
    )
    redis_groups: Annotated[dict[str, str], REDIS] = Field(
        default_factory=dict,
        description=(
            "Model name or glob -> Redis URL (a YAML/JSON mapping): the queues, streams and workers of"
            " the models it matches live there, the rest (keys, tenants, files, batches) on --redis-url."
            " An exact name beats any glob; among globs the first written wins."
        ),
        json_schema_extra=cli(metavar="YAML"),
    )
    log_level: Annotated[LogLevel, OBSERVABILITY] = Field(
        "INFO", description="DEBUG logs token-level detail."
    )
    log_format: Annotated[Literal["text", "json"], OBSERVABILITY] = Field(
        "text", description="json: one JSON object per line."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(init_settings, InitSettingsSource)
        return init_settings, env_settings, YamlFromConfigFile(settings_cls, init_settings)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str) -> str:
        return check_redis_url(url)

    @field_validator("redis_groups")
    @classmethod
    def _redis_groups(cls, groups: dict[str, str]) -> dict[str, str]:
        return check_redis_groups(groups)

    def model_groups(self) -> RedisGroups:
        """Where each model's Redis traffic goes: its group's Redis, or ``redis_url``."""
        return RedisGroups.of(self.redis_url, self.redis_groups)
