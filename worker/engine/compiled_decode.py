"""Owns the compiled decode step: the model's one-token forward through ``torch.compile`` (inductor),
one graph per batch-size bucket, the column count left dynamic.

A decode step of ``rows`` rows runs as the smallest bucket that holds them (powers of
two up to ``max_batch_size``), padded with idle rows (``SlotKVCache.begin_decode``);
the slot cache's slot and column counts are marked dynamic, so a bucket's graph
serves every length and storage size and is traced once. Weights are frozen into the graph
(``torch._inductor.config.freezing``): inductor's oneDNN linears need them as
constants, and then take the oneDNN-packed weights (``onednn_linear.py``) as they are.
Every bucket is compiled at start-up, before the worker is ready (``warm_up``), so no
request pays for a trace. A graph that raises leaves the step to the eager forward for
good (``hf.py``), with a log line.

Measured on this 2-core EPYC (AVX512_BF16), SmolLM2-135M bf16, one decode step with
oneDNN-packed weights: 1 row 27.8 -> 19.1 ms, 8 rows ~36 -> 25 ms, 32 rows 54 -> 43 ms.
What it costs: about 45-50 s of tracing and compiling per bucket on these 2 cores, at
every start (inductor's on-disk caches do not apply to frozen graphs), so 8 buckets
take 6-7 minutes. That is why ``--compile`` is off by default on CPU: a worker pays it
back only after serving for a long while, and restarts (deploys, failovers, tests) pay
it each time. Traps found on the way, all handled: a column count equal to the slot
capacity makes the view contiguous and recompiles the graph (the cache always keeps a
spare column); a storage of one slot or one column is a size dynamo specializes on
(the cache keeps at least two); the slot count, left static, recompiled a bucket each
time the storage grew (50 s stalls while serving); and ``dynamic=True`` over the batch
too made inductor emit code that raised ``NameError`` (torch 2.13).

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

# Each bucket is one graph (and ~45 s of start-up on 2 cores): powers of two, then the batch cap.
BUCKET_BASE = 2


def buckets_for(max_rows: int) -> tuple[int, ...]:
    """The batch sizes compiled: powers of two below ``max_rows``, and ``max_rows`` itself."""
    sizes, size = [], 1
    while size < max_rows:
        sizes.append(size)
        size *= BUCKET_BASE
    return (*sizes, max_rows)


def bucket_for(buckets: tuple[int, ...], rows: int) -> int:
    """The smallest of ``buckets`` (ascending) that holds ``rows``."""
    return next(size for size in buckets if size >= rows)


class CompiledDecode:
    """The decode forward of ``model`` compiled per bucket; ``logits`` runs one step."""

    def __init__(self, model: PreTrainedModel, max_rows: int, options: dict[str, Any]) -> None:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        self._model = model
        self.buckets = buckets_for(max_rows)
        # One graph per bucket, and a few to spare: past this limit dynamo would run eagerly.
        limit = max(torch._dynamo.config.recompile_limit, len(self.buckets) + 4)
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
        batch = bucket_for(self.buckets, rows)
        positions, mask = kv.begin_decode(batch)
        input_ids = torch.zeros((batch, 1), dtype=torch.long, device=mask.device)
        input_ids[:rows, 0] = torch.tensor(last_tokens, dtype=torch.long, device=mask.device)
        torch._dynamo.mark_dynamic(mask, 3)
        for tensor in (*kv.keys, *kv.values):  # slots and columns: the storage grows while serving
            torch._dynamo.mark_dynamic(tensor, 0)
            torch._dynamo.mark_dynamic(tensor, 2)
        return self._forward(input_ids, positions, mask, kv)[:rows]

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Trace and compile every bucket now, on a throwaway cache (blocking: minutes on a CPU)."""
        device = self._model.device
        prompt = torch.tensor([[1, 2]], device=device)
        cache = DynamicCache(config=self._model.config)
        self._model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        one_row = PaddedKVCache(cache, torch.ones_like(prompt))
        for size in self.buckets:
            started = time.perf_counter()
            kv = SlotKVCache(len(one_row.layer_tensors()), max_rows=self.buckets[-1])
            for _ in range(size):
                kv.join(one_row)
            self.logits(kv, [1] * size)
            logger.info("compiled the decode step for %d rows in %.1f s", size, time.perf_counter() - started)
