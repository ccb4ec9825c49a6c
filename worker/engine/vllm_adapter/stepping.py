"""Owns vLLM 0.32's ``LLMEngine.step`` split in two: waiting for the core's outputs, then processing them.

``LLMEngine.step`` blocks in ``engine_core.get_output()`` until the engine-core process
sends its next outputs (~60 ms at 32 streams), then hands them to the output processor
(detokenization, request states), aborts what a stop string ended and records the
statistics. The output processor is not thread-safe, and ``add_request`` and
``abort_request`` touch it too; split in two, the wait can run without the adapter's
lock, so an add reaches the core while a step is in flight, as in vLLM's own server
(its ``AsyncLLM`` adds at once while another task waits for outputs).

What the wait touches: ``SyncMPClient.get_output`` only reads its outputs queue, a
``queue.Queue`` that vLLM's own socket thread fills; adds and aborts write the input
socket (a zmq socket, not thread-safe), always under the adapter's lock. The in-process
client (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) steps the core inside ``get_output``, so
there the wait must hold the lock (``waits_without_lock``).

Intentional divergences from ``LLMEngine.step``: the data-parallel dummy batch and the
multimodal processor cache are left out (one engine, text prompts only).
"""

from __future__ import annotations

from typing import Any


def waits_without_lock(engine: Any) -> bool:
    """Whether ``engine``'s core runs in a process of its own, so waiting for it touches no shared state."""
    from vllm.v1.engine.core_client import InprocClient

    return not isinstance(engine.engine_core, InprocClient)


def wait_for_outputs(engine: Any) -> Any:
    """Block until the core's next ``EngineCoreOutputs`` (``LLMEngine.step``'s first half)."""
    return engine.engine_core.get_output()


def process_outputs(engine: Any, outputs: Any) -> list[Any]:
    """Turn the core's outputs into ``RequestOutput``s, as the rest of ``LLMEngine.step`` does."""
    from vllm.v1.metrics.stats import IterationStats

    iteration_stats = IterationStats() if engine.log_stats and outputs.outputs else None
    processed = engine.output_processor.process_outputs(
        outputs.outputs,
        engine_core_timestamp=outputs.timestamp,
        iteration_stats=iteration_stats,
        weight_version=outputs.weight_version,
    )
    engine.output_processor.update_scheduler_stats(outputs.scheduler_stats)
    engine.engine_core.abort_requests(processed.reqs_to_abort)  # requests a stop string ended
    if engine.logger_manager is not None and outputs.scheduler_stats is not None:
        # Recorded even when no request moved: ``SchedulerCounts`` reads the cache use from it.
        engine.logger_manager.record(
            scheduler_stats=outputs.scheduler_stats,
            iteration_stats=iteration_stats,
            mm_cache_stats=engine.renderer.stat_mm_cache(),
        )
        if outputs.outputs:
            engine.do_log_stats_with_interval()
    return list(processed.request_outputs)
