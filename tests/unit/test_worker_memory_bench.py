"""``bench.worker_memory``'s arithmetic: a token's KV from the model's config, and the peak against
weights plus the KV held at that moment."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.load import LevelRun
from bench.peers.memory import MB, Sample, Sampler, peak_mb, tree_rss
from bench.peers.systems import Endpoint
from bench.worker_memory import kv_bytes_per_token, report


def test_a_tokens_kv_is_layers_times_keys_and_values_of_every_kv_head(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert kv_bytes_per_token(tmp_path, "float32") == 30 * 2 * 3 * 64 * 4  # SmolLM2-135M: 45 KiB
    assert kv_bytes_per_token(tmp_path, "bfloat16") == 30 * 2 * 3 * 64 * 2
    (tmp_path / "config.json").write_text(json.dumps({**config, "head_dim": 128}))
    assert kv_bytes_per_token(tmp_path, "float32") == 30 * 2 * 3 * 128 * 4


def test_the_peak_is_set_against_the_weights_and_the_kv_held_at_that_sample() -> None:
    endpoint = Endpoint("native", "float32", "http://x", "m", Path("/tmp"))
    samples = [Sample(1200 * MB, 1000), Sample(1500 * MB, 2000), Sample(1400 * MB, 3000)]
    level = LevelRun(records=[], wall_s=10.0, deadline_hit=False)
    result = report(
        endpoint,
        idle=Sample(1000 * MB, 0),
        samples=samples,
        settled=Sample(1100 * MB, 0),
        weights=500 * MB,
        kv_token_bytes=MB // 8,
        runtime=300 * MB,
        level=level,
        concurrency=32,
    )
    assert (result.idle_mb, result.peak_mb, result.kv_mb_at_peak) == (1000, 1500, 250)
    assert result.settled_mb == 1100
    assert result.peak_over_needed == 2.0  # 1,500 / (500 + 250)
    assert result.above_runtime_over_needed == 1.6  # (1,500 - 300) / 750


def test_without_the_kv_held_no_ratio_is_made_up() -> None:
    endpoint = Endpoint("vllm", "float32", "http://x", "m", Path("/tmp"))
    level = LevelRun(records=[], wall_s=10.0, deadline_hit=False)
    result = report(
        endpoint,
        idle=Sample(1000 * MB),
        samples=[Sample(1100 * MB)],
        settled=Sample(1000 * MB),
        weights=500 * MB,
        kv_token_bytes=1,
        runtime=300 * MB,
        level=level,
        concurrency=32,
    )
    assert result.peak_mb == 1100 and result.kv_mb_at_peak is None and result.peak_over_needed is None


def test_a_process_trees_resident_memory_counts_this_process() -> None:
    assert tree_rss(os.getpid()) > 10 * MB
    assert tree_rss(2**22 + 12345) == 0  # no such process


def test_a_sampler_reads_a_process_until_stopped_and_a_disabled_one_reads_nothing() -> None:
    with Sampler(os.getpid(), None, 0.01) as sampler:
        time.sleep(0.1)
    assert len(sampler.samples) >= 3 and all(sample.kv_tokens is None for sample in sampler.samples)
    assert (peak_mb(sampler.samples) or 0) > 10
    with Sampler(0, None, 0.01, enabled=False) as idle:
        time.sleep(0.05)
    assert idle.samples == [] and peak_mb(idle.samples) is None
