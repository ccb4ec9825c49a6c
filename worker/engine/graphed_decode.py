"""Owns the decode step on CUDA: the eager one-token forward captured in CUDA graphs and replayed.

On a GPU a small model's decode step is bound by launching kernels, not by running
them: each of hundreds of kernels per step costs microseconds of Python and driver
time while the GPU waits. A CUDA graph replays them all with one launch. vLLM and
SGLang capture their decode steps by default for this reason, and so does this
engine on CUDA, unless ``--enforce-eager`` (vLLM's name) turns it off.

One graph per batch-size bucket and column bucket of the slot cache's storage:
- rows run in the smallest bucket that holds them (``buckets_for``: powers of two up to
  ``max_batch_size``), padded with idle rows (``SlotKVCache.begin_decode``);
- the columns read are the longest row's, rounded up to a power of two (at least
  ``COLUMN_QUANTUM``) and masked past each row's length, so one graph serves every
  length up to its bucket.

A graph reads and writes the storage at the addresses it was captured on. When the
storage is reallocated (it grows by doubling, so rarely), every graph is dropped and
captured again on first use; for the same reason the engine keeps its storage while
idle. Every batch bucket is captured at start-up on the first column bucket
(``warm_up``), before the worker is ready. A wider column bucket is captured when a
step first needs it: one eager forward and one capture, milliseconds on a GPU.

Static inputs: each graph owns its input ids, positions, row index and mask. A step
copies its values into them before replaying, and binds them to the cache
(``SlotKVCache.bind_step``) so the captured cache writes read them. The forward that
precedes a capture (lazy initialisations must not happen inside one) runs on the step's
real values: it writes each row's new key and value where the replay writes them again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from worker.engine.kv_cache import PaddedKVCache
from worker.engine.slot_cache import COLUMN_QUANTUM, SlotKVCache, doubled_to

logger = logging.getLogger(__name__)

# Each batch bucket is one graph per column bucket: powers of two, then the batch cap.
BUCKET_BASE = 2


def buckets_for(max_rows: int) -> tuple[int, ...]:
    """The batch sizes captured: powers of two below ``max_rows``, and ``max_rows`` itself."""
    sizes, size = [], 1
    while size < max_rows:
        sizes.append(size)
        size *= BUCKET_BASE
    return (*sizes, max_rows)


def bucket_for(buckets: tuple[int, ...], rows: int) -> int:
    """The smallest of ``buckets`` (ascending) that holds ``rows``."""
    return next(size for size in buckets if size >= rows)


def column_bucket(width: int) -> int:
    """The columns a step reads for rows up to ``width`` long: a power of two, at least the quantum."""
    return doubled_to(width, 0, quantum=COLUMN_QUANTUM)


@dataclass
class _Inputs:
    """A graph's static inputs: the addresses its kernels read."""

    input_ids: torch.Tensor  # [batch, 1]
    positions: torch.Tensor  # [batch]
    rows_index: torch.Tensor  # [batch]
    mask: torch.Tensor  # [batch, 1, 1, columns]

    @classmethod
    def shaped(cls, batch: int, columns: int, device: torch.device) -> _Inputs:
        return cls(
            input_ids=torch.zeros((batch, 1), dtype=torch.long, device=device),
            positions=torch.zeros(batch, dtype=torch.long, device=device),
            rows_index=torch.arange(batch, device=device),
            mask=torch.zeros((batch, 1, 1, columns), dtype=torch.bool, device=device),
        )


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: _Inputs
    logits: torch.Tensor  # [batch, vocab], written by each replay


class GraphedDecode:
    """The decode forward of ``model`` as CUDA graphs per bucket; ``logits`` runs one step."""

    def __init__(self, model: PreTrainedModel, max_rows: int) -> None:
        self._model = model
        self.buckets = buckets_for(max_rows)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._captured_on: tuple[SlotKVCache, int] | None = None  # the storage and its generation
        self._pool = torch.cuda.graph_pool_handle()  # graphs share one memory pool: one runs at a time
        self.captures = 0

    def logits(self, kv: SlotKVCache, last_tokens: list[int]) -> torch.Tensor:
        """The next-token logits ``[rows, vocab]`` of every row of ``kv``; the caller advances ``kv``."""
        rows = len(last_tokens)
        batch, columns = bucket_for(self.buckets, rows), column_bucket(max(kv.lengths) + 1)
        positions, mask = kv.begin_decode(batch, columns)  # may grow the storage: before any lookup
        graph = self._graphs.get((batch, columns)) if self._is_current(kv) else None
        inputs = graph.inputs if graph is not None else _Inputs.shaped(batch, columns, mask.device)
        inputs.input_ids.zero_()
        inputs.input_ids[:rows, 0] = torch.tensor(last_tokens, dtype=torch.long, device=mask.device)
        inputs.positions.copy_(positions[:, 0])
        inputs.mask.copy_(mask)
        kv.bind_step(inputs.positions, inputs.rows_index, inputs.mask)
        if graph is None:
            graph = self._graphs[(batch, columns)] = self._capture(kv, inputs)
        graph.graph.replay()
        return graph.logits[:rows].clone()  # the next replay overwrites the graph's own

    def _is_current(self, kv: SlotKVCache) -> bool:
        """Whether the graphs were captured on ``kv``'s storage as it is; if not, forget them."""
        if self._captured_on is not None:
            storage, generation = self._captured_on
            if storage is kv and generation == kv.generation:
                return True
        self._graphs.clear()  # they read and write storage that is gone
        self._captured_on = (kv, kv.generation)
        return False

    def _capture(self, kv: SlotKVCache, inputs: _Inputs) -> _Graph:
        started = time.perf_counter()
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(kv, inputs)  # lazy initialisations (cuBLAS workspaces) before the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._forward(kv, inputs)
        self.captures += 1
        logger.debug(
            "captured the decode step for %d rows x %d columns in %.3f s",
            inputs.positions.shape[0],
            inputs.mask.shape[-1],
            time.perf_counter() - started,
        )
        return _Graph(graph, inputs, logits)

    def _forward(self, kv: SlotKVCache, inputs: _Inputs) -> torch.Tensor:
        output = self._model(
            input_ids=inputs.input_ids,
            attention_mask=inputs.mask,
            position_ids=inputs.positions.unsqueeze(1),
            past_key_values=kv,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :]  # type: ignore[no-any-return]

    @torch.inference_mode()
    def warm_up(self) -> SlotKVCache:
        """Capture every batch bucket on the first column bucket; return the storage they were captured
        on, empty, for the engine to keep (graphs on any other storage would be captured again)."""
        started = time.perf_counter()
        device = self._model.device
        prompt = torch.tensor([[1, 2]], device=device)
        cache = DynamicCache(config=self._model.config)
        self._model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        one_row = PaddedKVCache(cache, torch.ones_like(prompt))
        kv = SlotKVCache(len(one_row.layer_tensors()), max_rows=self.buckets[-1])
        for _ in range(self.buckets[-1]):  # every slot at once: the storage never grows below
            kv.join(one_row)
        for size in reversed(self.buckets):
            kv.keep(list(range(size)))
            self.logits(kv, [1] * size)
            kv.abandon()
        kv.keep([])
        logger.info(
            "captured the decode step in CUDA graphs for %s rows in %.1f s",
            ", ".join(map(str, self.buckets)),
            time.perf_counter() - started,
        )
        return kv
