"""Owns the server processes' command line, generated from the settings models.

Each settings field becomes one flag, ``--field-name``, plus the other names its
``cli(...)`` metadata lists, in the help group its ``Annotated`` marker names, with its
description and its default as help text (``shared/settings.py``): flags cannot drift
from the environment variables and YAML keys, which pydantic-settings derives from the
same fields. Flags default to ``argparse.SUPPRESS`` so only flags actually given become
settings init values: a flag then beats the environment, which beats the YAML file;
``--help`` shows the field's default instead.

pydantic-settings' own ``CliSettingsSource`` was not used: ``serve`` parses one command
line for two models (gateway and worker share fields) and hands each child its part,
and flags kept from before and vLLM's names need aliases that are not YAML keys.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from shared.settings_base import ENV_PREFIX, GROUPS, TokenferrySettings

Flags = list[argparse.Action]


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def extra(field: FieldInfo) -> dict[str, Any]:
    """The field's command-line metadata (``shared.settings_base.cli`` and its group)."""
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def default_value(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return None if field.default is PydanticUndefined else field.default


def default_text(field: FieldInfo) -> str:
    """The default as a user would write it; the same on every machine (``~`` for home)."""
    value = default_value(field)
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_none=True)
    if value is None or value == []:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Path) and value.is_relative_to(Path.home()):
        return str(Path("~") / value.relative_to(Path.home()))
    if isinstance(value, dict):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def _yaml_mapping(value: str) -> dict[str, Any]:
    """A YAML file path or inline YAML mapping, e.g. '{mode: reduce-overhead}'."""
    path = Path(value)
    text = path.read_text() if path.is_file() else value
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        raise argparse.ArgumentTypeError("needs a YAML mapping or a file holding one")
    return loaded


class _DeprecatedName(argparse.Action):
    """A flag's old name: still stores its value, and says once which name to use."""

    def __init__(self, *args: Any, current: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current = current

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        print(f"tokenferry: {option_string} is deprecated; use {self.current}", file=sys.stderr)
        setattr(namespace, self.dest, values)


class _OnceAction(argparse.Action):
    """The model, given as ``MODEL`` or ``--model``: refuse two different ones."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        earlier = getattr(namespace, self.dest, values)
        if earlier != values:
            parser.error(f"the model is given twice ({earlier} and {values}): give it once")
        setattr(namespace, self.dest, values)


def base_type(annotation: Any) -> Any:
    """``int | None`` -> ``int``; other annotations as they are."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kinds = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return kinds[0] if len(kinds) == 1 else annotation
    return annotation


def _kind_options(name: str, field: FieldInfo) -> dict[str, Any]:
    """``add_argument`` options for the field's type: action, type, choices, nargs, metavar."""
    kind, meta = base_type(field.annotation), extra(field)
    metavar = meta.get("metavar")
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(kind) is list:
        many = {"action": "extend", "nargs": "+"} if meta.get("many") else {"action": "append"}
        return {**many, "metavar": metavar or "VALUE"}
    if typing.get_origin(kind) is typing.Literal:
        return {"choices": [*typing.get_args(kind), *meta.get("synonyms", {})]}
    if typing.get_origin(kind) is dict or (isinstance(kind, type) and issubclass(kind, BaseModel)):
        return {"type": _yaml_mapping, "metavar": metavar or "YAML"}
    if kind is float:
        return {"type": float, "metavar": metavar or ("S" if name.endswith("_s") else "F")}
    if kind is int:
        return {"type": int, "metavar": metavar or "N"}
    return {"type": kind if kind is Path else str, "metavar": metavar}


def _help(field: FieldInfo) -> str:
    text = f"{field.description or ''} (default: {default_text(field)})"
    return text.replace("%", "%%")  # argparse formats help with %


def _add_field(
    group: argparse._ArgumentGroup, name: str, field: FieldInfo, *, keep_default: bool
) -> argparse.Action:
    meta = extra(field)
    names = [flag_name(name), *meta.get("aliases", [])]
    options = _kind_options(name, field)
    if name == "model":
        options["action"] = _OnceAction
    if keep_default:  # read directly by the caller rather than as a settings value
        options["default"] = default_value(field)
    action = group.add_argument(*names, dest=name, help=_help(field), **options)
    if deprecated := meta.get("deprecated_alias"):
        # Its own hidden action: --help shows the current name only.
        kept = {key: options[key] for key in ("type", "metavar") if key in options}
        group.add_argument(
            deprecated, dest=name, action=_DeprecatedName, current=names[0], help=argparse.SUPPRESS, **kept
        )
    return action


def add_settings_flags(
    parser: argparse.ArgumentParser,
    models: Iterable[type[BaseSettings]],
    *,
    keep_defaults: Collection[str] = (),
) -> dict[str, argparse.Action]:
    """One flag per field of ``models`` (a field two models share gets one), in GROUPS order.

    The fields named in ``keep_defaults`` get their default as a real argparse default.
    A model with a ``model`` field also takes it as the positional ``MODEL``, as vLLM does.
    """
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    fields = {name: field for model in models for name, field in model.model_fields.items()}
    actions: dict[str, argparse.Action] = {}
    if "model" in fields:
        groups["Model"].add_argument(
            "model", nargs="?", metavar="MODEL", action=_OnceAction, help="the same as --model"
        )
    for name, field in fields.items():
        group = groups[extra(field).get("group", "Configuration")]
        actions[name] = _add_field(group, name, field, keep_default=name in keep_defaults)
    return actions


def add_redis_flag(parser: argparse.ArgumentParser) -> Flags:
    """``--redis-url`` alone, for the commands that only read Redis (``status``)."""
    field = TokenferrySettings.model_fields["redis_url"]
    return [parser.add_argument(flag_name("redis_url"), dest="redis_url", metavar="URL", help=_help(field))]


def flags_of(
    actions: dict[str, argparse.Action], model: type[BaseModel], *, skip: Collection[str] = ()
) -> Flags:
    """The flags of ``model``'s fields, but those in ``skip``."""
    return [actions[name] for name in model.model_fields if name not in skip]


def given(namespace: argparse.Namespace, flags: Flags) -> dict[str, Any]:
    """The settings values the user actually passed among ``flags``."""
    return {flag.dest: getattr(namespace, flag.dest) for flag in flags if hasattr(namespace, flag.dest)}


def to_argv(values: dict[str, Any], flags: Flags) -> list[str]:
    """Turn given values back into flags, to hand them to a child process."""
    argv: list[str] = []
    for flag in flags:
        if flag.dest in values:
            argv += _flag_argv(flag, values[flag.dest])
    return argv


def _flag_argv(flag: argparse.Action, value: Any) -> list[str]:
    name = flag.option_strings[0]
    if isinstance(flag, argparse.BooleanOptionalAction):
        return [name if value else "--no-" + name.removeprefix("--")]
    if isinstance(value, dict):
        return [name, yaml.safe_dump(value, default_flow_style=True).strip()]
    if isinstance(value, list):
        if flag.nargs in ("+", "*"):
            return [name, *map(str, value)]
        return [part for item in value for part in (name, str(item))]  # a repeatable flag
    return [name, str(value)]
