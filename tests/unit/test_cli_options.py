"""The server commands' flags come from the settings: one flag per field, vLLM's names, precedence."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import cli
from cli import SERVE_ONLY, options, reference
from shared import __version__
from shared.settings import GatewaySettings, WorkerSettings


def _subcommand(name: str) -> argparse.ArgumentParser:
    parser, _ = cli._parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


def _worker_settings(*argv: str) -> WorkerSettings:
    parser, flags = cli._parser()
    return WorkerSettings(**options.given(parser.parse_args(["worker", *argv]), flags["worker"]))


@pytest.mark.parametrize(
    ("command", "models"),
    [
        ("gateway", [GatewaySettings]),
        ("worker", [WorkerSettings]),
        ("serve", [GatewaySettings, WorkerSettings]),
    ],
)
def test_every_field_has_exactly_one_flag_and_every_flag_is_a_field(
    command: str, models: list[type[GatewaySettings | WorkerSettings]]
) -> None:
    fields = {name for model in models for name in model.model_fields}
    if command == "serve":
        fields |= set(SERVE_ONLY)  # serve's own options, such as --ready-timeout
    shown = [
        action.dest
        for action in _subcommand(command)._actions
        if action.option_strings and action.help != argparse.SUPPRESS and action.dest != "help"
    ]
    assert sorted(shown) == sorted(fields)  # sorted lists: a field with two flags would show twice
    for name in fields:
        assert options.flag_name(name) in _subcommand(command)._option_string_actions


@pytest.mark.parametrize("command", ["gateway", "worker", "serve"])
def test_help_shows_every_default_in_groups(command: str) -> None:
    text = _subcommand(command).format_help()
    models = {"gateway": [GatewaySettings], "worker": [WorkerSettings]}.get(
        command, [GatewaySettings, WorkerSettings]
    )
    for model in models:
        for name, field in model.model_fields.items():
            assert options.flag_name(name) in text
            assert f"(default: {options.default_text(field)})" in " ".join(text.split()), name
    for group in (
        "Model:" if command != "gateway" else "Server:",
        "Redis:",
        "Security:" if command != "worker" else "Engine:",
    ):
        assert f"\n{group}\n" in text


def test_version_prints_the_one_version_string(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"tokenferry {__version__}"


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_the_model_is_a_positional_argument_or_a_flag(command: str) -> None:
    parser, _ = cli._parser()
    assert parser.parse_args([command, "Qwen/Qwen2.5-0.5B-Instruct"]).model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert parser.parse_args([command, "--model", "gpt2"]).model == "gpt2"
    assert parser.parse_args([command, "--engine", "fake", "gpt2", "--port", "9"] if command == "serve" else
                             [command, "--engine", "fake", "gpt2"]).model == "gpt2"  # fmt: skip
    assert not hasattr(parser.parse_args([command]), "model")  # the default comes from the settings


def test_two_different_models_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser, _ = cli._parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "gpt2", "--model", "opt"])
    assert "error: the model is given twice (gpt2 and opt): give it once" in capsys.readouterr().err


def test_vllm_names_mean_the_same_settings() -> None:
    settings = _worker_settings(
        "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--dtype", "half",
        "--revision", "v1.0", "--served-model-name", "tiny",
    )  # fmt: skip
    assert (settings.max_batch_size, settings.max_prefill_tokens) == (4, 64)
    assert settings.dtype == "float16"
    assert settings.revision == "v1.0"
    assert settings.model_name == "tiny"
    assert _worker_settings("--dtype", "float").dtype == "float32"


def test_several_served_model_names_parse_into_the_model_and_its_aliases() -> None:
    settings = _worker_settings("--model", "gpt2", "--served-model-name", "a", "b", "a")
    assert settings.served_model_name == ["a", "b", "a"]
    assert (settings.model_name, settings.model_aliases) == ("a", ("b",))
    assert _worker_settings("--model", "gpt2").model_aliases == ()


def test_the_flags_used_before_still_work() -> None:
    parser, flags = cli._parser()
    args = parser.parse_args([
        "gateway", "--api-key", "k1", "--api-key", "k2", "--admin-api-key", "adm", "--cors-allow-origin", "*",
        "--request-timeout", "5", "--redis-timeout", "1", "--drain-grace", "3",
    ])  # fmt: skip
    gateway = GatewaySettings(**options.given(args, flags["gateway"]))
    assert (gateway.api_keys, gateway.admin_api_keys, gateway.cors_allow_origins) == (
        ["k1", "k2"],
        ["adm"],
        ["*"],
    )
    assert (gateway.request_timeout_s, gateway.redis_timeout_s, gateway.drain_grace_s) == (5, 1, 3)
    worker = _worker_settings("--poll-delay", "0.2", "--batch-hold", "0.1", "--stop-sequences", "a", "b")
    assert (worker.poll_delay_s, worker.batch_hold_s, worker.stop_sequences) == (0.2, 0.1, ["a", "b"])


def test_the_kv_budget_has_an_unambiguous_name_and_the_old_one_warns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _worker_settings("--kv-cache-tokens", "1000").kv_cache_tokens == 1000
    assert capsys.readouterr().err == ""
    assert _worker_settings("--max-batch-tokens", "2000").kv_cache_tokens == 2000
    assert capsys.readouterr().err == "tokenferry: --max-batch-tokens is deprecated; use --kv-cache-tokens\n"


def test_the_old_kv_budget_variable_and_yaml_key_still_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "worker.yaml"
    config.write_text("max_batch_tokens: 3000\n")
    assert _worker_settings("--config", str(config)).kv_cache_tokens == 3000
    monkeypatch.setenv("TOKENFERRY_MAX_BATCH_TOKENS", "4000")
    assert _worker_settings("--config", str(config)).kv_cache_tokens == 4000
    monkeypatch.setenv("TOKENFERRY_KV_CACHE_TOKENS", "5000")
    assert _worker_settings().kv_cache_tokens == 5000


def test_a_flag_beats_the_environment_which_beats_yaml_which_beats_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "worker.yaml"
    config.write_text("max_batch_size: 2\nmax_prefill_tokens: 128\nmax_num_beams: 3\n")
    monkeypatch.setenv("TOKENFERRY_CONFIG", str(config))
    monkeypatch.setenv("TOKENFERRY_MAX_BATCH_SIZE", "5")
    monkeypatch.setenv("TOKENFERRY_MAX_PREFILL_TOKENS", "256")
    settings = _worker_settings("--max-num-seqs", "9")
    assert settings.max_batch_size == 9  # flag over environment and YAML
    assert settings.max_prefill_tokens == 256  # environment over YAML
    assert settings.max_num_beams == 3  # YAML over the default
    assert settings.prefix_cache_tokens == WorkerSettings.model_fields["prefix_cache_tokens"].default


def test_serve_hands_each_child_its_own_flags_by_their_current_names() -> None:
    parser, flags = cli._parser()
    args = parser.parse_args(
        ["serve", "gpt2", "--max-num-seqs", "4", "--max-batch-tokens", "99", "--drain-grace", "7"]
    )
    worker = options.to_argv(options.given(args, flags["serve_worker"]), flags["serve_worker"])
    gateway = options.to_argv(options.given(args, flags["serve_gateway"]), flags["serve_gateway"])
    assert worker == [
        "--model",
        "gpt2",
        "--max-batch-size",
        "4",
        "--kv-cache-tokens",
        "99",
        "--drain-grace-s",
        "7.0",
    ]
    assert gateway == ["--drain-grace-s", "7.0"]


def test_the_configuration_reference_is_up_to_date() -> None:
    assert reference.PAGE.read_text() == reference.render(), "run: python -m cli.reference"


def test_an_invalid_value_is_one_line_naming_its_flag_and_variable() -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["gateway", "--port", "70000"])
    assert str(exited.value) == (
        "tokenferry gateway: invalid port (--port, TOKENFERRY_PORT):"
        " Input should be less than or equal to 65535"
    )
    with pytest.raises(SystemExit) as exited:
        cli.main(["worker", "--max-num-seqs", "0"])
    assert str(exited.value) == (
        "tokenferry worker: invalid max_batch_size (--max-batch-size, TOKENFERRY_MAX_BATCH_SIZE):"
        " Input should be greater than 0"
    )


def test_tool_call_parser_reasoning_parser_and_template_kwargs_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.requests.chat_options import ChatOptions

    defaults = _worker_settings()
    assert (defaults.tool_call_parser, defaults.reasoning_parser) == ("auto", "none")
    assert ChatOptions.of(defaults, "{{ '<tool_call>' }}") == ChatOptions({}, "hermes", "none")
    settings = _worker_settings(
        "--tool-call-parser", "mistral", "--reasoning-parser", "qwen3",
        "--default-chat-template-kwargs", '{"enable_thinking": false}',
    )  # fmt: skip
    assert ChatOptions.of(settings, "{{ '<tool_call>' }}") == ChatOptions(
        {"enable_thinking": False}, "mistral", "qwen3"
    )
    monkeypatch.setenv(
        "TOKENFERRY_DEFAULT_CHAT_TEMPLATE_KWARGS", '{"enable_thinking": true, "effort": "low"}'
    )
    monkeypatch.setenv("TOKENFERRY_TOOL_CALL_PARSER", "none")
    from_env = WorkerSettings()
    assert ChatOptions.of(from_env, None) == ChatOptions(
        {"enable_thinking": True, "effort": "low"}, None, "none"
    )


def test_an_unknown_parser_is_refused_at_start_up(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _worker_settings("--tool-call-parser", "pythonic")
    assert "invalid choice: 'pythonic'" in capsys.readouterr().err
