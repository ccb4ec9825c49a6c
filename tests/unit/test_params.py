"""Parameter precedence: request > server settings > model generation_config > library defaults."""

from __future__ import annotations

import pytest

from shared.errors import ContextLengthExceeded, InvalidRequest
from shared.protocol import SamplingSpec
from shared.settings import WorkerSettings
from worker.engine import EngineRequest
from worker.requests.limits import ModelLimits
from worker.requests.params import (
    DefaultLayers,
    build_engine_request,
    merge_specs,
    spec_from_generation_config,
)

LIMITS = ModelLimits(max_model_len=100, eos_token_ids=frozenset({2}), vocab_size=50, max_num_beams=4)


NOTHING = SamplingSpec()


def _request(
    spec: SamplingSpec, server: SamplingSpec = NOTHING, model: SamplingSpec = NOTHING
) -> EngineRequest:
    return build_engine_request("r", [1, 2, 3], spec, DefaultLayers(server, model), LIMITS)


def test_request_beats_server_beats_model_beats_library() -> None:
    server = SamplingSpec(temperature=0.5, top_p=0.8)
    model = SamplingSpec(temperature=0.9, top_p=0.7, top_k=40)
    merged = merge_specs(SamplingSpec(temperature=0.1), server, model)
    assert (merged.temperature, merged.top_p, merged.top_k, merged.typical_p) == (0.1, 0.8, 40, None)
    params = _request(SamplingSpec(temperature=0.1), server, model).sampling
    assert (params.temperature, params.top_p, params.top_k, params.typical_p) == (0.1, 0.8, 40, 1.0)


def test_absent_temperature_with_no_defaults_is_greedy() -> None:
    assert _request(SamplingSpec()).sampling.is_greedy


def test_ignore_eos_request_over_server_default() -> None:
    assert _request(SamplingSpec(), SamplingSpec(ignore_eos=True)).eos_token_ids == frozenset()
    assert _request(SamplingSpec(ignore_eos=False), SamplingSpec(ignore_eos=True)).eos_token_ids == {2}
    assert _request(SamplingSpec()).eos_token_ids == {2}


def test_max_tokens_defaults_to_the_rest_of_the_context_window() -> None:
    assert _request(SamplingSpec()).max_new_tokens == 97
    assert _request(SamplingSpec(), SamplingSpec(max_tokens=10)).max_new_tokens == 10
    # A default larger than the room left is clamped, not an error: the client asked for nothing.
    assert _request(SamplingSpec(), model=SamplingSpec(max_tokens=1000)).max_new_tokens == 97


def test_requested_max_tokens_beyond_the_window_is_context_length_exceeded() -> None:
    with pytest.raises(ContextLengthExceeded) as raised:
        _request(SamplingSpec(max_tokens=98))
    assert raised.value.status == 400
    assert "maximum context length is 100 tokens" in raised.value.message


def test_prompt_filling_the_window_is_context_length_exceeded() -> None:
    with pytest.raises(ContextLengthExceeded):
        build_engine_request(
            "r", list(range(100)), SamplingSpec(), DefaultLayers(SamplingSpec(), SamplingSpec()), LIMITS
        )


def test_top_k_minus_one_disables() -> None:
    assert _request(SamplingSpec(top_k=-1)).sampling.top_k == 0


def test_invalid_values_are_invalid_requests_naming_the_param() -> None:
    with pytest.raises(InvalidRequest) as raised:
        _request(SamplingSpec(top_p=0))
    assert raised.value.param == "top_p"


@pytest.mark.parametrize(
    ("config", "temperature"),
    [
        ({"do_sample": True, "temperature": 0.6}, 0.6),
        ({"do_sample": True}, 1.0),
        ({"do_sample": False, "temperature": 0.6}, 0.0),
        ({"temperature": 0.6}, 0.0),  # transformers samples only with do_sample
        ({}, None),
    ],
)
def test_generation_config_sampling_mode(config: dict[str, object], temperature: float | None) -> None:
    assert spec_from_generation_config(config).temperature == temperature


def test_server_settings_defaults_come_from_env_and_yaml_below_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from pathlib import Path

    config = Path(str(tmp_path)) / "worker.yaml"
    config.write_text(
        "ignore_eos: true\nstop_sequences: [END]\ndefault_sampling: {temperature: 0.3, top_k: 5}\n"
    )
    monkeypatch.setenv("TOKENFERRY_DEFAULT_SAMPLING__TEMPERATURE", "0.7")
    settings = WorkerSettings(config_file=config, ignore_eos=False)
    defaults = settings.server_sampling_defaults()
    assert defaults.ignore_eos is False  # flag beats YAML
    assert defaults.temperature == 0.7  # env beats YAML
    assert defaults.top_k == 5  # YAML beats library
    assert defaults.stop == ["END"]


def test_logit_bias_reaches_the_engine_and_is_checked_against_the_vocabulary() -> None:
    assert _request(SamplingSpec(logit_bias={7: 5.0, 3: -100.0})).sampling.logit_bias == (
        (3, -100.0),
        (7, 5.0),
    )
    with pytest.raises(InvalidRequest) as raised:
        _request(SamplingSpec(logit_bias={50: 1.0}))
    assert raised.value.param == "logit_bias"
