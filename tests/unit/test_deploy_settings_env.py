"""Every TOKENFERRY_* variable the deployment files set is one the settings read, with a value they accept.

A misspelt variable is silently ignored by pydantic-settings (``extra="ignore"``),
so a deployment could run on defaults while looking configured. The valid names
are derived from the settings models themselves, nested ``__`` names included.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic import AliasChoices, BaseModel
from pydantic_settings import BaseSettings

from shared.settings import GatewaySettings, WorkerSettings
from tests.deployment import compose, dockerfile_env, k8s_container_env, k8s_manifests

PREFIX = "TOKENFERRY_"
# Read by the YAML settings source itself, not through a field.
SOURCE_VARIABLES = {"TOKENFERRY_CONFIG"}


def _env_names(model: type[BaseModel], prefix: str) -> tuple[set[str], set[str]]:
    """Exact names, and prefixes under which any name is read (models that allow extra keys)."""
    names: set[str] = set()
    open_prefixes: set[str] = set()
    for field_name, field in model.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, str | AliasChoices):
            choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
            names |= {choice.upper() for choice in choices if isinstance(choice, str)}
            continue
        name = f"{prefix}{field_name.upper()}"
        names.add(name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            nested, nested_open = _env_names(annotation, f"{name}__")
            names |= nested
            open_prefixes |= nested_open
            if annotation.model_config.get("extra") == "allow":
                open_prefixes.add(f"{name}__")
    return names, open_prefixes


def _unknown(env: dict[str, str], settings: type[BaseSettings]) -> set[str]:
    names, open_prefixes = _env_names(settings, PREFIX)
    names |= SOURCE_VARIABLES
    ours = {name for name in env if name.upper().startswith(PREFIX)}
    return {
        name
        for name in ours
        if name.upper() not in names and not name.upper().startswith(tuple(open_prefixes))
    }


def _compose_env(service: dict[str, Any]) -> dict[str, str]:
    return {name: str(value) for name, value in service.get("environment", {}).items()}


def _deployments() -> dict[str, dict[str, Any]]:
    return {
        doc["metadata"]["name"]: doc for doc in k8s_manifests().values() if "template" in doc.get("spec", {})
    }


def _environments() -> list[tuple[str, type[BaseSettings] | None, dict[str, str]]]:
    """(where, the settings that read it or None for a non-tokenferry process, its environment)."""
    roles: dict[str, type[BaseSettings]] = {"gateway": GatewaySettings, "worker": WorkerSettings}
    found: list[tuple[str, type[BaseSettings] | None, dict[str, str]]] = []
    for name, service in compose()["services"].items():
        found.append((f"compose {name}", roles.get(name.split("-")[0]), _compose_env(service)))
    for name, workload in _deployments().items():
        found.append((f"k8s {name}", roles.get(name), k8s_container_env(workload)))
    for role, settings in roles.items():
        found.append((f"Dockerfile.{role}", settings, dockerfile_env(f"Dockerfile.{role}")))
    return found


def test_the_derived_names_cover_flat_and_nested_settings() -> None:
    names, open_prefixes = _env_names(WorkerSettings, PREFIX)
    assert {"TOKENFERRY_REDIS_URL", "TOKENFERRY_MODEL", "TOKENFERRY_DEFAULT_SAMPLING__TEMPERATURE"} <= names
    assert "TOKENFERRY_COMPILE_ARGS__" in open_prefixes
    assert "TOKENFERRY_MODEL" not in _env_names(GatewaySettings, PREFIX)[0]


@pytest.mark.parametrize(
    ("where", "settings", "env"), [pytest.param(*found, id=found[0]) for found in _environments()]
)
def test_every_variable_set_is_read_by_that_processs_settings(
    where: str, settings: type[BaseSettings] | None, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if settings is None:
        assert not [name for name in env if name.startswith(PREFIX)], f"{where} is no tokenferry process"
        return
    assert _unknown(env, settings) == set(), where
    # And the values parse: build the settings from exactly this environment.
    for name in [name for name in os.environ if name.startswith(PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    loaded = settings()
    assert loaded.redis_url == env.get("TOKENFERRY_REDIS_URL", loaded.redis_url)


def test_a_misspelt_variable_would_be_caught() -> None:
    assert _unknown({"TOKENFERRY_REDIS_URI": "redis://x"}, GatewaySettings) == {"TOKENFERRY_REDIS_URI"}
    assert _unknown({"TOKENFERRY_MODEL": "m"}, GatewaySettings) == {"TOKENFERRY_MODEL"}
