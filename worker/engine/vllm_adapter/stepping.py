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

from collections.abc import Callable
from typing import Any


def waits_without_lock(engine: Any) -> bool:
    """Whether ``engine``'s core runs in a process of its own, so waiting for it touches no shared state."""
    from vllm.v1.engine.core_client import InprocClient

    return not isinstance(engine.engine_core, InprocClient)


def wait_for_outputs(engine: Any) -> Any:
    """Block until the core's next ``EngineCoreOutputs`` (``LLMEngine.step``'s first half)."""
    return engine.engine_core.get_output()


def process_outputs(engine: Any, outputs: Any, record: Callable[[Any], None]) -> list[Any]:
    """Turn the core's outputs into ``RequestOutput``s, as the rest of ``LLMEngine.step`` does;
    ``record`` gets the scheduler's statistics of every core step.

    vLLM's own stat loggers and per-request iteration statistics are left out: they fill
    Prometheus metrics in a registry the worker never serves and a log line every few seconds,
    and cost ~10-15 % of the worker's CPU at one stream (py-spy, fp32); the worker's metrics
    come from the driver and from ``record``.
    """
    processed = engine.output_processor.process_outputs(
        outputs.outputs,
        engine_core_timestamp=outputs.timestamp,
        iteration_stats=None,
        weight_version=outputs.weight_version,
    )
    engine.output_processor.update_scheduler_stats(outputs.scheduler_stats)
    engine.engine_core.abort_requests(processed.reqs_to_abort)  # requests a stop string ended
    if outputs.scheduler_stats is not None:  # even when no request moved: the cache's use is in it
        record(outputs.scheduler_stats)
    return list(processed.request_outputs)
