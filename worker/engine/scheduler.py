"""Owns admission and prefill planning for the batched engine: pure bookkeeping, no torch.

Admission is FIFO and limited twice: by ``max_batch_size`` rows and by
``max_batch_tokens``, the cache the batch holds: rows x the longest row, as the
slot cache stores them (``slot_cache.py``). Each sequence counts with what it holds
now (a new one with its prompt and first token), not its final length: requests
without ``max_tokens`` (which default to the rest of the context window) used to
reserve that much, as TGI's router does, and kept others waiting for memory they
would never use. When growing rows outgrow the budget, the engine preempts the
least urgent, newest row and resumes it later (``hf.py``, ``_preempt``), as vLLM
does. The head of the queue is never skipped (no starvation), and a lone request
is always admitted even when it alone exceeds the budget, so nothing waits
forever. Requests that do not fit wait in the queue; they never fail.

Prefill is chunked: each step spends at most ``max_prefill_tokens`` on prompts,
so a long prompt delays the decoding batch by one chunk per step, not by its
whole prefill.

The prompts that finish prefill in a step run as padded forwards of rows x the
longest remainder; ``group_by_length`` splits them where one more forward costs
less than the padding it saves. Measured on a 2-core CPU (SmolLM2-135M): about
3.4 ms per padded token slot plus ~110 ms per forward, so one forward's fixed
cost is worth ``PREFILL_FORWARD_OVERHEAD_TOKENS`` = 32 slots. It matters with the
prefix cache: 19 prompts with ~16 tokens left after a cached prefix shared a
forward with one 36-token chunk remainder, 19 x 36 slots (2.34 s) for 340 tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from worker.engine import EngineRequest, output_start


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_batch_size: int = 32
    max_batch_tokens: int = 131_072
    max_prefill_tokens: int = 2048


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    request_id: str
    start: int
    stop: int
    prompt_length: int

    @property
    def is_last(self) -> bool:
        return self.stop == self.prompt_length


PREFILL_FORWARD_OVERHEAD_TOKENS = 32


def group_by_length(lengths: list[int], overhead: int = PREFILL_FORWARD_OVERHEAD_TOKENS) -> list[list[int]]:
    """Indices of ``lengths`` in groups, each one padded forward costing ``overhead`` plus rows x its
    longest, at the least total cost (shortest first). Optimal groups are runs of the sorted lengths."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cost, cut = [0] + [0] * len(order), [0] * (len(order) + 1)  # best cost of the first j, its last cut
    for j in range(1, len(order) + 1):
        longest = lengths[order[j - 1]]
        cost[j], cut[j] = min((cost[i] + overhead + (j - i) * longest, i) for i in range(j))
    groups: list[list[int]] = []
    end = len(order)
    while end > 0:
        groups.insert(0, order[cut[end] : end])
        end = cut[end]
    return groups


def final_length(request: EngineRequest) -> int:
    """The most cache positions a request can occupy."""
    return output_start(request) + request.max_new_tokens


def first_length(request: EngineRequest) -> int:
    """The cache positions a request holds at its first decode step: its prompt and one token."""
    return len(request.prompt_token_ids) + 1


def reserved_tokens(lengths: list[int]) -> int:
    """What rows of ``lengths`` take from the budget: rows x the longest (a slot is as long as that)."""
    return len(lengths) * max(lengths, default=0)


def queue_by_priority(waiting: deque[EngineRequest], request: EngineRequest) -> None:
    """Queue ``request`` after every request of its priority or a more urgent one (FIFO within one)."""
    position = len(waiting)
    while position > 0 and waiting[position - 1].priority > request.priority:
        position -= 1
    waiting.insert(position, request)


class Scheduler:
    """Waiting queue plus the rules for who joins the batch and how much prefill runs per step."""

    def __init__(self, limits: BatchLimits) -> None:
        self.limits = limits
        self.waiting: deque[EngineRequest] = deque()

    def add(self, request: EngineRequest) -> None:
        queue_by_priority(self.waiting, request)

    def remove(self, request_id: str) -> bool:
        """Drop a waiting request; whether it was waiting."""
        before = len(self.waiting)
        self.waiting = deque(request for request in self.waiting if request.request_id != request_id)
        return len(self.waiting) != before

    def resume(self, request: EngineRequest) -> None:
        """Queue a preempted sequence's resumption first among its priority: it was admitted before."""
        position = 0
        while position < len(self.waiting) and self.waiting[position].priority < request.priority:
            position += 1
        self.waiting.insert(position, request)

    def admit(self, held: list[int]) -> list[EngineRequest]:
        """Pop the waiting requests that fit beside sequences holding ``held`` positions each."""
        admitted: list[EngineRequest] = []
        lengths = list(held)
        while self.waiting and self._fits(lengths, first_length(self.waiting[0])):
            request = self.waiting.popleft()
            admitted.append(request)
            lengths.append(first_length(request))
        return admitted

    def _fits(self, lengths: list[int], length: int) -> bool:
        if not lengths:
            return True
        if len(lengths) >= self.limits.max_batch_size:
            return False
        padded = (len(lengths) + 1) * max(*lengths, length)
        return padded <= self.limits.max_batch_tokens

    def plan_prefill(
        self, progress: list[tuple[str, int, int]], budget: int | None = None
    ) -> list[PrefillChunk]:
        """Chunks to prefill from (request_id, prefilled, prompt_length), oldest first, in ``budget``
        tokens (``max_prefill_tokens`` unless given: what a prefill turn has left)."""
        budget = self.limits.max_prefill_tokens if budget is None else budget
        chunks: list[PrefillChunk] = []
        for request_id, prefilled, prompt_length in progress:
            if budget <= 0:
                break
            stop = min(prompt_length, prefilled + budget)
            chunks.append(PrefillChunk(request_id, prefilled, stop, prompt_length))
            budget -= stop - prefilled
        return chunks
