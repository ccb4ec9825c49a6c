"""Worker metrics: what the driver feeds in comes out in the Prometheus exposition and the heartbeat load."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client import generate_latest

from shared.errors import WorkerFailed
from shared.protocol import Delta, Failed, Finished, FinishReason, GenerationJob, TextPrompt, Usage
from shared.redis_server import free_port
from tests.scrape import Scrape
from worker.engine import EngineStats, SequenceUpdate
from worker.metrics import FinishedReason, WorkerMetrics

MODEL = "org/served-model"
SUCCESS = "tokenferry_worker_request_success_total"


def _scrape(metrics: WorkerMetrics) -> Scrape:
    return Scrape.parse(generate_latest(metrics.registry).decode())


def _job(created_at: float) -> GenerationJob:
    return GenerationJob(request_id="r1", model="m", prompt=TextPrompt(text="hi"), created_at=created_at)


def test_steps_count_generated_tokens_batch_sizes_and_step_time() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.observe_step(0.02, [SequenceUpdate("a", (1,)), SequenceUpdate("b", (2, 3))])
    metrics.observe_step(0.01, [SequenceUpdate("a", (4,)), SequenceUpdate("b", ())])
    scrape = _scrape(metrics)
    assert scrape.value("tokenferry_worker_generation_tokens_total") == 4
    assert scrape.value("tokenferry_worker_step_duration_seconds_count") == 2
    assert scrape.value("tokenferry_worker_step_duration_seconds_sum") == pytest.approx(0.03)
    # Sequences that produced a token: 2 in the first step, 1 in the second.
    assert scrape.value("tokenferry_worker_batch_size_count") == 2
    assert scrape.value("tokenferry_worker_batch_size_sum") == 3
    assert scrape.value("tokenferry_worker_batch_size_bucket", le="1.0") == 1


def test_engine_occupancy_and_kv_cache_use_are_gauges() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.observe_engine(
        EngineStats(
            running=3,
            waiting=2,
            kv_reserved_tokens=300,
            kv_capacity_tokens=1200,
            kv_held_tokens=250,
            prefix_cache_tokens=400,
        )
    )
    scrape = _scrape(metrics)
    assert scrape.type_of("tokenferry_worker_running_sequences") == "gauge"
    assert scrape.value("tokenferry_worker_running_sequences") == 3
    assert scrape.value("tokenferry_worker_waiting_sequences") == 2
    assert scrape.value("tokenferry_worker_kv_cache_reserved_tokens") == 300
    assert scrape.value("tokenferry_worker_kv_cache_usage_ratio") == 0.25
    assert scrape.value("tokenferry_worker_kv_cache_held_tokens") == 250
    assert scrape.value("tokenferry_worker_prefix_cache_held_tokens") == 400
    metrics.observe_engine(EngineStats(running=0, waiting=0))  # an engine without a shared cache
    assert _scrape(metrics).value("tokenferry_worker_kv_cache_usage_ratio") == 0


def test_prefix_cache_hits_become_a_counter_of_reused_prompt_tokens() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.observe_engine(EngineStats(running=1, waiting=0, prefix_cache_hit_tokens=24))
    metrics.observe_engine(EngineStats(running=2, waiting=0, prefix_cache_hit_tokens=24))
    metrics.observe_engine(EngineStats(running=2, waiting=0, prefix_cache_hit_tokens=60))
    scrape = _scrape(metrics)
    assert scrape.type_of("tokenferry_worker_prefix_cache_hit_tokens") == "counter"
    assert scrape.value("tokenferry_worker_prefix_cache_hit_tokens_total") == 60


def test_admission_counts_prompt_tokens_and_queue_wait_since_creation() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.observe_acceptance(_job(created_at=time.time() - 0.5), prompt_tokens=12)
    metrics.observe_acceptance(_job(created_at=time.time() + 30), prompt_tokens=3)  # a skewed clock
    scrape = _scrape(metrics)
    assert scrape.value("tokenferry_worker_prompt_tokens_total") == 15
    assert scrape.value("tokenferry_worker_queue_wait_seconds_count") == 2
    assert 0.5 <= scrape.value("tokenferry_worker_queue_wait_seconds_sum") < 1.5


def test_failovers_are_counted() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.record_failover()
    assert _scrape(metrics).value("tokenferry_worker_failovers_total") == 1


def test_the_heartbeat_load_reports_tokens_per_second_since_the_last_sample() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.sample_load()
    metrics.observe_engine(EngineStats(running=2, waiting=1))
    metrics.observe_step(0.01, [SequenceUpdate("a", (1,)), SequenceUpdate("b", (2,))])
    time.sleep(0.05)
    load = metrics.sample_load()
    assert (load.running, load.waiting) == (2, 1)
    assert 0 < load.generation_tokens_per_s <= 2 / 0.05
    assert metrics.sample_load().generation_tokens_per_s == 0  # nothing generated since


def test_two_workers_in_one_process_keep_separate_registries() -> None:
    first, second = WorkerMetrics(MODEL), WorkerMetrics(MODEL)
    first.record_failover()
    assert _scrape(second).value("tokenferry_worker_failovers_total") == 0


def test_the_metrics_port_serves_the_exposition() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.record_failover()
    server = metrics.serve(free_port(), "127.0.0.1")
    try:
        response = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
    finally:
        server.close()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert Scrape.parse(response.text).value("tokenferry_worker_failovers_total") == 1


WORKER_FAMILIES = {
    f"tokenferry_worker_{name}"
    for name in (
        "running_sequences",
        "waiting_sequences",
        "kv_cache_reserved_tokens",
        "kv_cache_usage_ratio",
        "kv_cache_held_tokens",
        "prefix_cache_held_tokens",
        "batch_size",
        "step_duration_seconds",
        "step_gap_seconds",
        "route_duration_seconds",
        "publish_duration_seconds",
        "queue_wait_seconds",
        "prompt_tokens",
        "generation_tokens",
        "prefix_cache_hit_tokens",
        "grammar_compile_seconds",
        "grammar_mask_seconds",
        "failovers",
        "request_success",
        "request_prompt_tokens",
        "request_generation_tokens",
    )
}


def test_every_worker_metric_carries_the_served_model_as_model_name() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.observe_engine(EngineStats(running=1, waiting=0))
    metrics.observe_step(0.01, [SequenceUpdate("a", (1,))])
    metrics.observe_acceptance(_job(created_at=time.time()), prompt_tokens=2)
    usage = Usage(prompt_tokens=2, completion_tokens=1)
    metrics.observe_outcomes([Finished(finish_reason=FinishReason.STOP, usage=usage)])
    scrape = _scrape(metrics)
    assert {name.removesuffix("_created") for name in scrape.families} == WORKER_FAMILIES
    samples = [sample for _type, family in scrape.families.values() for sample in family]
    assert samples and all(sample.labels.get("model_name") == MODEL for sample in samples)
    assert scrape.value("tokenferry_worker_running_sequences", model_name=MODEL) == 1
    assert scrape.value("tokenferry_worker_generation_tokens_total", model_name="another-model") == 0


def test_each_ended_request_is_counted_once_by_its_finish_reason() -> None:
    metrics = WorkerMetrics(MODEL)
    usage = Usage(prompt_tokens=7, completion_tokens=3)
    metrics.observe_outcomes(
        [
            Delta(text="a", token_ids=[97]),  # tokens on their way: no request ended
            Finished(finish_reason=FinishReason.STOP, usage=usage),
            Finished(finish_reason=FinishReason.LENGTH, usage=usage),
            Finished(finish_reason=FinishReason.LENGTH, usage=usage),
            Failed(error=WorkerFailed("the model failed").to_info()),
        ]
    )
    metrics.record_end(FinishedReason.ABORT)
    metrics.record_end(FinishedReason.ERROR)
    scrape = _scrape(metrics)
    assert scrape.type_of("tokenferry_worker_request_success") == "counter"
    reasons = ("stop", "length", "abort", "error")
    counts = {reason: scrape.value(SUCCESS, finished_reason=reason) for reason in reasons}
    assert counts == {"stop": 1, "length": 2, "abort": 1, "error": 2}


def test_a_request_that_ended_calling_tools_counts_as_stopped() -> None:
    metrics = WorkerMetrics(MODEL)
    usage = Usage(prompt_tokens=7, completion_tokens=3)
    metrics.observe_outcomes([Finished(finish_reason=FinishReason.TOOL_CALLS, usage=usage)])
    assert _scrape(metrics).value(SUCCESS, finished_reason="stop") == 1


def test_every_finish_reason_is_exported_from_the_start_at_zero() -> None:
    scrape = _scrape(WorkerMetrics(MODEL))
    reasons = {labels["finished_reason"] for labels in scrape.labels_of(SUCCESS)}
    assert reasons == {"stop", "length", "abort", "error"}
    assert scrape.value(SUCCESS) == 0


def test_completed_requests_observe_their_prompt_and_generation_lengths() -> None:
    metrics = WorkerMetrics(MODEL)
    short, long = (
        Usage(prompt_tokens=12, completion_tokens=3),
        Usage(prompt_tokens=1500, completion_tokens=64),
    )
    metrics.observe_outcomes(
        [
            Finished(finish_reason=FinishReason.STOP, usage=short),
            Finished(finish_reason=FinishReason.LENGTH, usage=long),
        ]
    )
    scrape = _scrape(metrics)
    prompt = "tokenferry_worker_request_prompt_tokens"
    generation = "tokenferry_worker_request_generation_tokens"
    assert scrape.type_of(prompt) == scrape.type_of(generation) == "histogram"
    assert (scrape.value(f"{prompt}_count"), scrape.value(f"{prompt}_sum")) == (2, 1512)
    assert (scrape.value(f"{generation}_count"), scrape.value(f"{generation}_sum")) == (2, 67)
    # vLLM's 1-2-5 buckets: 12 tokens fall in le=20, 1,500 in le=2000.
    assert scrape.value(f"{prompt}_bucket", le="10.0") == 0
    assert scrape.value(f"{prompt}_bucket", le="20.0") == 1
    assert scrape.value(f"{prompt}_bucket", le="2000.0") == 2
    assert scrape.value(f"{generation}_bucket", le="5.0") == 1
    assert scrape.value(f"{generation}_bucket", le="100.0") == 2
