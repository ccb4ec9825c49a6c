"""The pure parts of ``python -m bench.peers``: options, workload draws, statistics, shares and tables."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from bench.peers import loop_time, report, workloads
from bench.peers.machine import LinearLimit, MachineLimits
from bench.peers.options import PeersOptions, estimate_s, parse_options, requests_at
from bench.peers.shares import machine_shares, parameter_count
from bench.peers.systems import SystemSetup, tokenferry_worker_args, vllm_server_argv
from bench.stats import RequestRecord, summarize_level

LIMITS = MachineLimits(
    threads=2,
    linear=(
        LinearLimit("float32", 32, plain_gflops=100.0, packed_gflops=200.0),
        LinearLimit("float32", 256, plain_gflops=400.0, packed_gflops=None),
    ),
    copy_gb_s=50.0,
)


def _words(text: str) -> int:
    return len(text.split())


def test_quick_is_c1_and_c8_at_float32_without_the_long_workload() -> None:
    options = parse_options(["--quick"])
    assert (options.levels, options.dtypes, options.skip_long) == ((1, 8), ("float32",), True)
    assert parse_options(["--quick", "--levels", "32,1", "--dtypes", "bfloat16"]).levels == (1, 32)


def test_unknown_systems_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_options(["--systems", "vllm,sglang"])


def test_each_level_sends_four_requests_per_client_and_its_own_prompts() -> None:
    options = PeersOptions(levels=(1, 8, 32, 64))
    assert [requests_at(c) for c in options.levels] == [16, 32, 128, 256]
    assert [options.first_prompt(c) for c in options.levels] == [0, 16, 48, 176]


def test_the_full_run_is_estimated_under_35_minutes_and_quick_a_fraction_of_it() -> None:
    assert estimate_s(PeersOptions()) < 35 * 60
    assert estimate_s(parse_options(["--quick"])) < 8 * 60  # mostly three start-ups


def test_long_workload_draws_are_the_same_for_a_seed_and_in_range() -> None:
    drawn = workloads.draw_lengths(48, seed=0)
    assert drawn == workloads.draw_lengths(48, seed=0)
    assert drawn != workloads.draw_lengths(48, seed=1)
    assert all(300 <= prompt <= 1500 and 32 <= output <= 256 for prompt, output in drawn)


def test_long_prompts_reach_their_drawn_length_and_differ() -> None:
    requests = workloads.long_requests(_words, overhead=30, count=8, seed=0)
    assert requests == workloads.long_requests(_words, overhead=30, count=8, seed=0)
    for request, (target, output) in zip(requests, workloads.draw_lengths(8, seed=0), strict=True):
        assert target <= request.prompt_tokens < target + 20  # one sentence past the target at most
        assert request.prompt_tokens == 30 + _words(request.prompt)
        assert request.max_tokens == output
    assert len({request.prompt[:400] for request in requests}) == len(requests)


def test_long_body_replaces_the_prompt_and_length_of_each_request() -> None:
    requests = workloads.long_requests(_words, overhead=0, count=2, seed=3)
    body = workloads.long_body(requests)(1)
    assert body == {
        "messages": [{"role": "user", "content": requests[1].prompt}],
        "max_tokens": requests[1].max_tokens,
    }


def test_tpot_percentiles_are_per_request() -> None:
    records = []
    for index, step_s in enumerate((0.01, 0.02, 0.03)):
        record = RequestRecord(index=index, started_at=0.0, completion_tokens=5)
        record.chunk_times = [0.1 + step_s * token for token in range(5)]
        records.append(record)
    summary = summarize_level(records, wall_s=1.0, expected_tokens=5)
    assert (summary["tpot_ms_p50"], summary["tpot_ms_p99"]) == (20.0, 29.8)
    assert summary["output_tokens_per_s"] == 15.0


def test_linear_limit_is_the_better_kernel_at_the_nearest_row_count() -> None:
    assert LIMITS.linear_gflops("float32", 1) == 200.0
    assert LIMITS.linear_gflops("float32", 64) == 200.0  # 64 is nearer 32 than 256 on a log scale
    assert LIMITS.linear_gflops("float32", 200) == 400.0
    assert LIMITS.linear_gflops("bfloat16", 32) is None


def test_shares_of_the_machine() -> None:
    shares = machine_shares(100.0, concurrency=1, dtype="float32", parameters=250_000_000, limits=LIMITS)
    assert shares == {
        "model_gflops": 50.0,
        "share_of_linear": 0.25,
        "weights_gb_s": 100.0,
        "share_of_copy": 2.0,
    }
    long = machine_shares(
        10.0, computed_tokens_per_s=800.0, concurrency=16, dtype="float32", parameters=250_000_000,
        limits=LIMITS, prefill_bound=True,
    )  # fmt: skip
    assert long == {
        "model_gflops": 400.0,
        "share_of_linear": 1.0,
        "weights_gb_s": None,
        "share_of_copy": None,
    }


def test_parameter_count_reads_safetensors_headers(tmp_path: Path) -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "embed": {"dtype": "F32", "shape": [10, 4], "data_offsets": [0, 160]},
        "norm": {"dtype": "F32", "shape": [4], "data_offsets": [160, 176]},
    }
    encoded = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(176))
    assert parameter_count(tmp_path) == 44


def test_ratios_are_to_vllm_at_the_same_level() -> None:
    vllm = {"output_tokens_per_s": 200.0, "ttft_ms_p50": 50.0}
    ours = {"output_tokens_per_s": 150.0, "ttft_ms_p50": 75.0}
    assert report.vs_baseline(ours, vllm) == {"vs_vllm_tokens_per_s": 0.75, "vs_vllm_ttft_p50": 1.5}
    assert report.vs_baseline(ours, None) == {"vs_vllm_tokens_per_s": None, "vs_vllm_ttft_p50": None}


def test_the_table_has_a_row_per_level_and_per_failed_system() -> None:
    level = {
        "kind": "peers_level", "system": "native", "dtype": "float32", "workload": "chat", "concurrency": 8,
        "output_tokens_per_s": 167.25, "vs_vllm_tokens_per_s": 0.66, "ttft_ms_p50": 80.0,
        "ttft_ms_p99": 140.0, "vs_vllm_ttft_p50": 1.2, "tpot_ms_p50": 45.0, "tpot_ms_p99": 60.0,
        "model_gflops": 45.0, "share_of_linear": 0.225, "weights_gb_s": 11.2, "share_of_copy": 0.16,
        "loop_share": 0.0434, "engine_rss_peak_mb": 1511, "errors": 0,
    }  # fmt: skip
    failed = {"kind": "peers_error", "system": "vllm-engine", "dtype": "float32", "error": "exited: no vllm"}
    lines = report.levels_table([{"kind": "peers_run"}, level, failed])
    assert len(lines) == 4
    assert all(line.count("|") == 18 for line in lines)
    assert lines[2] == (
        "| native | float32 | chat c=8 | 167 | 0.66 | 80.0 | 140 | 1.20 | 45.0 | 60.0 | 45.0 | 22 % "
        "| 11.2 | 16 % | 4.3 % | 1511 | 0 |"
    )
    assert lines[3].startswith("| vllm-engine | float32 | failed: exited: no vllm | - |")


def test_the_loop_share_is_gaps_over_gaps_and_steps_between_two_reads() -> None:
    page = (
        "# TYPE tokenferry_worker_step_gap_seconds histogram\n"
        'tokenferry_worker_step_gap_seconds_sum{model_name="m"} 1.5\n'
        'tokenferry_worker_step_gap_seconds_count{model_name="m"} 300.0\n'
        'tokenferry_worker_step_duration_seconds_sum{model_name="m"} 30.0\n'
        'tokenferry_worker_step_duration_seconds_count{model_name="m"} 400.0\n'
        'tokenferry_worker_route_duration_seconds_sum{model_name="m"} 0.6\n'
        'tokenferry_worker_publish_duration_seconds_sum{model_name="m"} 0.8\n'
    )
    before, after = loop_time.LoopTime(0.5, 11.0, 20, 0.4, 0.4), loop_time.parse(page)
    assert after == loop_time.LoopTime(1.5, 30.0, 400, 0.6, 0.8)
    assert loop_time.share(before, after) == {
        "loop_share": 0.05, "loop_gap_s": 1.0, "step_ms_mean": 50.0,
        "route_share": 0.01, "publish_share": 0.02,
    }  # fmt: skip
    assert loop_time.share(None, after) == {} and loop_time.parse("other 1\n") is None


def test_every_system_gets_the_same_model_name_dtype_and_context_window() -> None:
    setup = SystemSetup(Path("/models/smol"), ".venv-vllm/bin/python", ("--max-batch-size=64",))
    assert tokenferry_worker_args(setup, "bfloat16", "vllm") == [
        "--model", "/models/smol", "--served-model-name", "smollm2", "--dtype", "bfloat16",
        "--max-model-len", "2048", "--engine", "vllm", "--max-batch-size=64",
    ]  # fmt: skip
    argv = vllm_server_argv("python", Path("/models/smol"), 8123, "bfloat16")
    assert argv[argv.index("--served-model-name") + 1] == "smollm2"
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[argv.index("--max-model-len") + 1] == "2048"
