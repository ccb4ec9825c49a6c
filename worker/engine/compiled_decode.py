"""Owns the compiled decode step: the model's one-token forward through ``torch.compile`` (inductor),
two graphs: one row, and any other batch size with the column count.

A one-row step runs its own graph (dynamo specializes a dimension of size 1 anyway).
Every other step runs one graph whose batch dimension is dynamic, with no padding: the
forward's inputs and the slot cache's per-step tensors (``SlotKVCache.step_tensors``)
are marked dynamic in their batch, and the storage in its slot and column counts, so a
graph is traced once and serves every batch size, length and storage size. Weights are
frozen into the graph (``torch._inductor.config.freezing``): inductor's oneDNN linears
need them as constants, and then take the oneDNN-packed weights (``onednn_linear.py``)
as they are. Both graphs are compiled at start-up, before the worker is ready
(``warm_up``), so no request pays for a trace. A graph that raises leaves the step to the
eager forward for good (``hf.py``), with a log line.

Measured on this 2-core EPYC (AVX512_BF16), SmolLM2-135M bf16, one decode step with
oneDNN-packed weights: 1 row 27.8 -> 19.1 ms, 8 rows ~36 -> 25 ms, 32 rows 54 -> 43 ms
(one graph per power-of-two bucket then). What it costs: tracing and compiling takes
66 s for the one-row graph and 107 s for the dynamic one on these 2 cores (173 s at
start-up), at every start: inductor's on-disk caches do not apply to frozen graphs whose
constants are oneDNN tensors ("mkldnn tensors unpickleable"; AOTAutograd's: "freezing
enabled"). One graph per power-of-two batch bucket took 7 x 63-68 s (459 s) and ran a
33-row step as 64 rows. ``--compile`` stays off by default on CPU: a worker pays its
start-up back only after serving for a while, and restarts (deploys, failovers, tests)
pay it each time.

Traps found on the way, all handled: a column count equal to the slot capacity makes
the view contiguous and recompiles the graph (the cache always keeps a spare column);
a storage of one slot or one column is a size dynamo specializes on (the cache keeps at
least two); the slot count, left static, recompiled each time the storage grew (50 s
stalls while serving); ``dynamic=True`` made inductor emit code that raised
``NameError`` (torch 2.13); and a per-step tensor reached only through the cache (its
write positions, its rows) left unmarked pins the batch to the warm-up's size.

Divergence: greedy tokens match the eager forward's in tests, but the compiled graph
fuses elementwise work (norms, rotary, activations) and may differ from eager in the
last bits, as any kernel change can.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from worker.engine.kv_cache import PaddedKVCache
from worker.engine.slot_cache import SlotKVCache

logger = logging.getLogger(__name__)

# The batch size the dynamic graph is traced on (or the batch cap, if smaller): any size but 1,
# which dynamo would specialize on.
TRACE_ROWS = 6


def graph_sizes(max_rows: int) -> tuple[int, ...]:
    """The batch sizes traced at start-up: one row, then one size for the dynamic graph."""
    return (1,) if max_rows == 1 else (1, min(max_rows, TRACE_ROWS))


class CompiledDecode:
    """The decode forward of ``model`` compiled for one row and for any batch; ``logits`` runs one step."""

    def __init__(self, model: PreTrainedModel, max_rows: int, options: dict[str, Any]) -> None:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        self._model = model
        self.sizes = graph_sizes(max_rows)
        self._max_rows = max_rows
        # Two graphs, and a few to spare: past this limit dynamo would run eagerly.
        limit = max(torch._dynamo.config.recompile_limit, len(self.sizes) + 4)
        torch._dynamo.config.recompile_limit = limit
        self._forward = torch.compile(self._step, **{"dynamic": False, **options})

    def _step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, kv: SlotKVCache
    ) -> torch.Tensor:
        output = self._model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=kv,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :]  # type: ignore[no-any-return]

    def logits(self, kv: SlotKVCache, last_tokens: list[int]) -> torch.Tensor:
        """The next-token logits ``[rows, vocab]`` of every row of ``kv``; the caller advances ``kv``."""
        rows = len(last_tokens)
        positions, mask = kv.begin_decode()
        input_ids = torch.tensor(last_tokens, dtype=torch.long, device=mask.device).unsqueeze(1)
        torch._dynamo.mark_dynamic(mask, 3)
        if rows > 1:  # the batch: every tensor that carries it, or one left static pins it
            for tensor in (input_ids, positions, *kv.step_tensors()):
                torch._dynamo.mark_dynamic(tensor, 0)
        for tensor in (*kv.keys, *kv.values):  # slots and columns: the storage grows while serving
            torch._dynamo.mark_dynamic(tensor, 0)
            torch._dynamo.mark_dynamic(tensor, 2)
        return self._forward(input_ids, positions, mask, kv)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Trace and compile both graphs now, on a throwaway cache (blocking: minutes on a CPU)."""
        device = self._model.device
        prompt = torch.tensor([[1, 2]], device=device)
        cache = DynamicCache(config=self._model.config)
        self._model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        one_row = PaddedKVCache(cache, torch.ones_like(prompt))
        for size in self.sizes:
            started = time.perf_counter()
            kv = SlotKVCache(len(one_row.layer_tensors()), max_rows=self._max_rows)
            for _ in range(size):
                kv.join(one_row)
            self.logits(kv, [1] * size)
            shape = "1 row" if size == 1 else "any batch size"
            logger.info("compiled the decode step for %s in %.1f s", shape, time.perf_counter() - started)
