"""Owns the batched transformers backend: continuous batching over one padded KV cache.

A step is schedule, execute, update (vLLM V1's shape):
  1. admit waiting requests that fit (``scheduler.py``);
  2. prefill: a turn of at most ``max_prefill_tokens`` of new prompts, chunked; a prompt
     whose last chunk ran samples its first token and its cache joins the batch;
  3. decode: one more token for every running row, the rows sampled together, each
     with its own parameters and generator (``batch_sampling.py``);
  4. rows that finished leave the cache (``kv_cache.py``).
Where the model runs the direct forward with the one-call decode attention
(``direct_forward.py``) and the prompts prefilling have at most ``MIXED_PROMPT_TOKENS``
left, a step runs the rows' decode and those prompts' last chunks in one forward
(``_decode_beside``; vLLM's mixed batch): their tokens go through every product
together, one pass over the weights where two forwards took two, and a prompt arriving
after a prefill step does not wait for a decode step before its own. That saves a
fixed cost (see the constant), which counts beside short prompts only: in process,
chat at c=32 with arrivals spread got its first tokens in 197-205 ms against 237-304
(fp32, 2-core EPYC). Beside long prompts one forward costs what two did, so mixing
them would only make their first tokens wait for the rows' decode.
Otherwise prefill and decode alternate while prompts wait: a step that prefilled is
followed by one that decodes, so a burst of new prompts costs the running streams at
most one prefill chunk between two of their tokens, as when both ran in one step.
Apart, a step's first tokens go out when its prefill ends, not after a decode forward
of the whole batch too (a step's updates are published when it returns): the long
workload's first tokens came ~100 ms sooner (a 16-row decode at ~1,200 columns, fp32,
2-core Xeon). For the same reason a prefill turn (its budget's chunks, planned at once)
runs over as many steps as it has forwards that give first tokens: the groups of last
chunks (the most urgent first, then the shortest), then the earlier chunks of longer
prompts, which give none. Each
step ends after one such forward, so its prompts' first tokens go out before the next
group's forward, not after the whole turn's (up to ~2 s of fp32 prefill here); the rows
still wait for the whole turn, as when it ran in one step. One exception prefills even after a
prefill: when a prompt to prefill is more urgent than every running row (an
interactive request beside batch-lane rows only), the step prefills the prompts of
that priority alone and the rows wait, so the request's first token does not wait
for a decode forward of the whole batch (vLLM V0 runs prefills apart from decodes
for the same reason). Nobody streams those rows, so nobody sees the pause.
Logprobs are scored from the same raw logits the step samples from
(``sampling.score_tokens``), before a constrained row's grammar masks its copy
(``token_masks.py``); a prompt whose logprobs were asked keeps its prefill's
logits at every position instead of the last one only.
Requests the batch cannot honour (beam search) run alone through
``model.generate`` (``sequential.run_beam_search``). A sequence that breaks a
step fails alone; the others go on unchanged (``isolation.py``).

Prefix caching (``prefix_cache.py``; off unless ``prefix_cache_tokens`` > 0): chat
prompts share their template's system prompt, so, as vLLM and SGLang do, every
prefilled prompt's KV is kept and a later prompt starting the same way is seeded
with it and prefills only the rest (prompt-logprobs requests need every
position's logits and never reuse). The prompts whose last chunk runs in a step
share padded forwards whatever they already hold (nothing, a reused prefix,
earlier chunks): a row is [padding, held, padding, rest], the mask covers both.
Numerics caveat: a reused prefix's KV was computed in another batch, so floats
can differ in the last bits from recomputing it. Intentional divergences:
- the lookup runs before each step's prefill plan, for prompts not started yet,
  not at admission: a burst is admitted in one step, before anything is stored;
- prompts arriving together before their common start is cached (the first burst
  after a start) compute that shared prefix once, in a forward of its own, and
  then all reuse it (``prefix_cache.shared_prefixes``);
- those prompts run in groups of similar remainders (``scheduler.group_by_length``),
  not in one forward: one chunked prompt's 36-token remainder padded 18 ~16-token
  post-hit ones, and the cache saved nothing (32 prompts, prefill alone: one
  forward 4.3 s, groups 3.5 s, no cache 4.8 s).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from functools import partial
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache

from worker.engine import EngineRequest, EngineStats, SequenceUpdate, cpu_kernels, failed_update
from worker.engine.batch_sampling import BatchSampler
from worker.engine.compiled_decode import CompiledDecode
from worker.engine.decode_attention import KERNEL_ATTENTION_NAME, use_decode_attention
from worker.engine.direct_forward import DirectForward, PromptForward
from worker.engine.graphed_decode import GraphedDecode
from worker.engine.isolation import accept_rows, bisect, failing_alone, guarded, sample_rows
from worker.engine.kv_cache import PaddedKVCache, prefill_layout, single_row_cache, stack_left_padded
from worker.engine.prefix_cache import PrefixCache, shared_prefixes
from worker.engine.scheduler import (
    BatchLimits,
    PrefillChunk,
    Scheduler,
    group_by_length,
    reserved_tokens,
)
from worker.engine.sequence import Sequence, resumption_of
from worker.engine.sequential import run_beam_search
from worker.engine.slot_cache import SlotKVCache
from worker.engine.token_masks import TokenMasks

logger = logging.getLogger(__name__)


# The most prompt tokens a step runs beside its rows' decode in one forward. What one forward
# saves over two is a fixed ~15-35 ms (a pass over the weights at few rows, the head, the Python),
# so it counts beside short prompts only. One forward against a prefill plus a decode, in process,
# 2-core EPYC: 45 tokens beside 8 rows 0.79x the time (fp32); 90 beside 31 rows 0.92x (fp32),
# 0.85x (bf16); 256 beside 31 rows 0.98x; 900 beside 16 rows 1.00x. Past that the prompt's first
# token would wait for the rows' decode for nothing: steps alternate instead (module docstring).
MIXED_PROMPT_TOKENS = 128


class TransformersEngine:
    """An ``Engine`` whose running sequences share every decode forward pass."""

    def __init__(
        self,
        model: PreTrainedModel,
        limits: BatchLimits,
        prefix_cache_tokens: int = 0,
        compile_options: dict[str, Any] | None = None,
        cuda_graphs: bool = True,
        use_cpu_kernels: bool = True,
        direct_forward: bool = True,
    ) -> None:
        self._model = model
        self._device = model.device
        self._scheduler = Scheduler(limits)
        self._prefix_cache = PrefixCache(prefix_cache_tokens)
        self._prefilling: dict[str, Sequence] = {}
        self._rows: list[Sequence] = []  # row i of the cache is self._rows[i]
        self._prefilled_last = False  # the last step prefilled: the next one decodes (see the docstring)
        self._turn_left: int | None = None  # prefill tokens the turn under way has left; None: no turn
        self._kv: SlotKVCache | None = None
        # Decode steps attend through ``decode_attention.py`` where the model allows it; others keep
        # their attention and get the slot cache's mask as an additive float mask.
        # On CPU their eager steps run the fused kernel, where it builds (``cpu_kernels``).
        self._boolean_mask = use_decode_attention(model, kernel=use_cpu_kernels)
        # Decode steps replayed as CUDA graphs on a GPU (``graphed_decode.py``), unless told not to;
        # on CPU through torch.compile, one row and any batch (``compiled_decode.py``), when asked.
        self._compiled: CompiledDecode | GraphedDecode | None = None
        if cuda_graphs and self._device.type == "cuda":
            if self._boolean_mask:
                self._compiled = GraphedDecode(model, limits.max_batch_size)
            else:
                logger.warning("CUDA graphs need the decode attention this model lacks; decoding eagerly")
        elif compile_options is not None:
            if self._boolean_mask:
                self._compiled = CompiledDecode(model, limits.max_batch_size, compile_options)
            else:
                logger.warning("--compile needs the decode attention this model cannot use; decoding eagerly")
        # Eager CPU steps and prefills of Llama-family models skip transformers' forward around their
        # modules (``direct_forward.py``): the same ops, a quarter less time at small batches.
        self._direct: DirectForward | None = None
        if direct_forward and self._compiled is None and self._boolean_mask:
            kernels = cpu_kernels.kernels() if use_cpu_kernels and self._device.type == "cpu" else None
            self._direct = DirectForward.build(model, kernels)
        self._admissions = itertools.count()  # admission order: the newest row is preempted first
        self._generators: dict[str, torch.Generator | None] = {}  # preempted rows' generators, kept
        self._masks = TokenMasks()  # constrained rows' grammars (``request.grammar``), applied per step
        self._sampler = BatchSampler()  # samples a step's rows together (``batch_sampling.py``)

    def add(self, request: EngineRequest) -> None:
        self._scheduler.add(request)

    def abort(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        if self._scheduler.remove(request_id) or self._prefilling.pop(request_id, None) is not None:
            return
        self._drop_rows({request_id})

    def has_unfinished(self) -> bool:
        return bool(self._scheduler.waiting or self._prefilling or self._rows)

    def stats(self) -> EngineStats:
        admitted = [*self._rows, *self._prefilling.values()]
        held = self._held_lengths()
        return EngineStats(
            running=len(admitted),
            waiting=len(self._scheduler.waiting),
            kv_reserved_tokens=reserved_tokens(held),
            kv_capacity_tokens=self._scheduler.limits.max_batch_tokens,
            kv_held_tokens=sum(held),
            prefix_cache_tokens=self._prefix_cache.stored_tokens,
            prefix_cache_hit_tokens=self._prefix_cache.hit_tokens,
            grammar_mask_seconds=self._masks.seconds,
            grammar_mask_fills=self._masks.fills,
        )

    def close(self) -> None:
        self._scheduler.waiting.clear()
        self._prefilling.clear()
        self._generators.clear()
        self._rows, self._kv = [], None

    @torch.inference_mode()
    def step(self) -> list[SequenceUpdate]:
        updates = self._admit()
        urgent = self._urgent_prefill()
        if urgent is not None:  # the rows wait a step: all of them are less urgent than a prompt to prefill
            updates += self._prefill(urgent)
            self._prefilled_last = True
        elif self._prefilling and self._turn_left is not None:  # the rest of a prefill turn
            updates += self._prefill(self._prefilling.values())
            self._prefilled_last = True
        elif self._prefilling and self._rows and self._mixes_prompts():
            self._preempt()
            updates += self._prefill(self._prefilling.values(), beside_rows=True)
            self._prefilled_last = False
        elif self._prefilling and not (self._rows and self._prefilled_last):
            updates += self._prefill(self._prefilling.values())
            self._prefilled_last = True
        else:
            self._preempt()
            updates += self._decode()
            self._prefilled_last, self._turn_left = False, None
        self._drop_rows({update.request_id for update in updates if update.is_finished})
        return updates

    def _mixes_prompts(self) -> bool:
        """Whether the prompts prefilling ride in the rows' decode forward this step: the direct
        forward can run both (``DirectForward.mixes``) and they have at most
        ``MIXED_PROMPT_TOKENS`` left to prefill."""
        if self._direct is None or not self._direct.mixes:
            return False
        left = sum(len(s.request.prompt_token_ids) - s.prefilled for s in self._prefilling.values())
        return left <= MIXED_PROMPT_TOKENS

    def _urgent_prefill(self) -> list[Sequence] | None:
        """The prompts to prefill alone this step, or None for a normal step.

        Those of the most urgent priority prefilling, when it is more urgent than every
        running row's: an interactive request beside batch-lane rows only.
        """
        if not self._rows or not self._prefilling:
            return None
        most_urgent = min(sequence.request.priority for sequence in self._prefilling.values())
        if most_urgent >= min(row.request.priority for row in self._rows):
            return None
        return [
            sequence for sequence in self._prefilling.values() if sequence.request.priority == most_urgent
        ]

    def _held_lengths(self, growth: int = 0) -> list[int]:
        """The cache positions each admitted sequence holds (``growth`` more per running row): its
        row's tokens, or the prompt it is prefilling."""
        rows = [length + growth for length in self._kv.lengths] if self._kv is not None else []
        return rows + [len(sequence.request.prompt_token_ids) for sequence in self._prefilling.values()]

    def _preempt(self) -> None:
        """Free the least urgent, newest rows until the next decode step fits the cache budget.

        A preempted row leaves the cache and waits at the head of the queue as a resumption
        (``resumption_of``): its prompt and its tokens so far, prefilled again when it fits, with
        its own generator and grammar state, so its stream just goes on later (vLLM's recompute).
        """
        budget = self._scheduler.limits.max_batch_tokens
        while len(self._rows) > 1 and reserved_tokens(self._held_lengths(growth=1)) > budget:
            victim = max(self._rows, key=lambda row: (row.request.priority, row.admitted))
            logger.info("cache budget reached: preempting %s to resume later", victim.request_id)
            self._drop_rows({victim.request_id})
            self._scheduler.resume(resumption_of(victim))
            self._generators[victim.request_id] = victim.generator

    def _admit(self) -> list[SequenceUpdate]:
        updates: list[SequenceUpdate] = []
        for request in self._scheduler.admit(self._held_lengths(growth=1)):
            if request.sampling.num_beams > 1:
                updates.append(guarded(request.request_id, partial(run_beam_search, self._model, request)))
                continue
            try:
                generator = self._generators.pop(request.request_id, None)  # a resumption's own
                sequence = Sequence.start(request, self._device, generator, admitted=next(self._admissions))
                self._prefilling[request.request_id] = sequence
            except Exception:
                logger.exception("sequence %s could not start; failing it alone", request.request_id)
                updates.append(failed_update(request.request_id))
        return updates

    def _decode(self) -> list[SequenceUpdate]:
        """One forward for every row; when it fails, the rows that fail alone leave and the rest go again."""
        if self._kv is None or not self._rows:
            return []
        try:
            logits = self._decode_forward(self._kv)
        except Exception:
            self._kv.abandon()  # what the failed forward wrote lies past every row's length
            culprits = failing_alone(self._model, self._kv, self._rows)
            if not culprits:
                raise  # the whole batch fails, whatever it holds
            logger.warning("a decode forward failed; %d rows fail alone, the rest go again", len(culprits))
            self._drop_rows(culprits)
            return [failed_update(request_id) for request_id in culprits] + self._decode()
        return accept_rows(self._rows, sample_rows(self._rows, logits, self._masks, self._sampler))

    def compile_decode(self) -> None:
        """Compile or capture the decode step's graphs now (start-up; a no-op when decoding eagerly).
        CUDA graphs come with the storage they were captured on: it is kept."""
        if self._compiled is not None:
            try:
                storage = self._compiled.warm_up()
            except Exception:  # e.g. a model whose forward pins the batch size: serve it eagerly
                logger.exception("compiling the decode step failed; decoding eagerly")
                self._compiled = None
                return
            if storage is not None:
                self._kv = storage

    def _decode_forward(self, kv: SlotKVCache) -> torch.Tensor:
        """The last position's logits ([rows, vocab]) of one more token for every row."""
        if self._compiled is not None:
            try:
                logits = self._compiled.logits(kv, [row.token_ids[-1] for row in self._rows])
            except Exception:
                logger.exception("the compiled decode step failed; decoding eagerly from now on")
                self._compiled = None
                kv.abandon()
            else:
                kv.advance()
                return logits
        if self._direct is not None:
            logits = self._direct.logits(kv, [row.token_ids[-1] for row in self._rows])
            kv.advance()
            return logits
        input_ids = torch.tensor([[row.token_ids[-1]] for row in self._rows], device=self._device)
        positions, mask = kv.begin_decode()
        output = self._model(
            input_ids=input_ids,
            # A 4D mask reaches the attention as it is (transformers builds none).
            attention_mask=mask if self._boolean_mask else _additive(mask, self._model.dtype),
            position_ids=positions,
            past_key_values=kv,
            use_cache=True,
            logits_to_keep=1,  # only the last position is sampled; skip the rest of the LM head
        )
        kv.advance()
        return output.logits[:, -1, :]  # type: ignore[no-any-return]

    def _prefill(self, candidates: Iterable[Sequence], beside_rows: bool = False) -> list[SequenceUpdate]:
        """Prefill this step's part of a prefill turn over ``candidates``: its forwards up to the first
        that gives first tokens, the turn going on next step while forwards remain (the docstring's
        turns). ``beside_rows``: the whole plan now, the rows decoding in the forward of one group of
        last chunks where there is one (``_decode_beside``)."""
        # Interactive prompts are prefilled before batch ones (sorted() is stable: FIFO within a priority).
        prefilling = sorted(candidates, key=lambda s: s.request.priority)
        self._reuse_prefixes(prefilling)
        if self._compute_shared_prefixes(prefilling):
            self._reuse_prefixes(prefilling)
        progress = [(s.request_id, s.prefilled, len(s.request.prompt_token_ids)) for s in prefilling]
        budget = self._scheduler.limits.max_prefill_tokens if self._turn_left is None else self._turn_left
        units = self._prefill_units(self._scheduler.plan_prefill(progress, budget))
        if beside_rows:  # before the other groups join: a row decodes once a step
            self._turn_left = None
            groups = [unit for unit in units if unit[0].is_last]
            beside = groups.pop() if groups else []
            updates = [update for unit in units if not unit[0].is_last for update in self._run_unit(unit)]
            updates += self._decode_beside([self._prefilling.pop(chunk.request_id) for chunk in beside])
            return updates + [update for unit in groups for update in self._run_unit(unit)]
        updates = []
        for index, unit in enumerate(units):
            updates += self._run_unit(unit)
            budget -= sum(chunk.stop - chunk.start for chunk in unit)
            if updates and index + 1 < len(units):  # these first tokens go out now; the turn goes on
                self._turn_left = budget
                return updates
        self._turn_left = None
        return updates

    def _prefill_units(self, chunks: list[PrefillChunk]) -> list[list[PrefillChunk]]:
        """A plan's forwards in the order they run. First the prompts whose last chunk runs, in padded
        groups of similar rests (``group_by_length``): the most urgent priority first, the shortest
        first within one. Then the earlier chunks of longer prompts, one forward each: they give no
        first token, so nothing waits for them."""
        last = [chunk for chunk in chunks if chunk.is_last]
        priority = {chunk.request_id: self._prefilling[chunk.request_id].request.priority for chunk in last}
        units: list[list[PrefillChunk]] = []
        for level in sorted(set(priority.values())):
            ours = [chunk for chunk in last if priority[chunk.request_id] == level]
            groups = group_by_length([chunk.stop - chunk.start for chunk in ours])
            units += [[ours[index] for index in group] for group in groups]
        return units + [[chunk] for chunk in chunks if not chunk.is_last]

    def _run_unit(self, unit: list[PrefillChunk]) -> list[SequenceUpdate]:
        """One prefill forward: an earlier chunk of a prompt, or last chunks that then join the batch."""
        if not unit[0].is_last:
            update = self._prefill_chunk(unit[0])
            return [] if update is None else [update]
        return bisect(self._prefill_together, [self._prefilling.pop(chunk.request_id) for chunk in unit])

    def _decode_beside(self, sequences: list[Sequence]) -> list[SequenceUpdate]:
        """The rows' decode step and the last chunks of ``sequences``' prompts in one forward
        (``DirectForward.mixed_logits``); apart, each with its own isolation, where that cannot run or
        fails. The rows are sampled first: the prompts join the batch after them."""
        if not sequences or self._kv is None or self._direct is None:
            return self._decode() + (bisect(self._prefill_together, sequences) if sequences else [])
        try:
            prompts = self._prompt_operands(sequences)
            both = self._direct.mixed_logits(self._kv, [row.token_ids[-1] for row in self._rows], prompts)
        except Exception:
            # A prompt or a row that breaks the forward fails alone below, in its own path.
            logger.warning("a decode step with prompts beside it failed; running them apart", exc_info=True)
            both = None
        if both is None:
            self._kv.abandon()
            return self._decode() + bisect(self._prefill_together, sequences)
        self._kv.advance()
        step_logits, prompt_logits = both
        updates = accept_rows(self._rows, sample_rows(self._rows, step_logits, self._masks, self._sampler))
        try:
            return updates + self._finish_prefill(sequences, prompts, prompt_logits)
        except Exception:  # nothing changed for the prompts: they prefill again, apart
            logger.warning("prompts beside a decode step failed; prefilling them apart", exc_info=True)
            return updates + bisect(self._prefill_together, sequences)

    def _reuse_prefixes(self, sequences: list[Sequence]) -> None:
        """Seed the prompts not started yet with the longest cached prefix of theirs, if any."""
        for sequence in sequences:
            if sequence.prefilled or sequence.wants_prompt_scores:
                continue  # prompt logprobs need every position's logits: nothing can be skipped
            hit = self._prefix_cache.match(sequence.request.prompt_token_ids)
            if hit is not None:
                sequence.prefill_cache = single_row_cache(hit.layers, self._model.config)
                sequence.prefilled = hit.length

    def _compute_shared_prefixes(self, sequences: list[Sequence]) -> bool:
        """Compute once, and cache, the prefixes prompts not started yet share; whether any was."""
        fresh = [s.request.prompt_token_ids for s in sequences if not (s.prefilled or s.wants_prompt_scores)]
        if len(fresh) < 2 or not self._prefix_cache.is_enabled:
            return False
        longest = self._scheduler.limits.max_prefill_tokens  # a longer one would stall decoding: leave it
        prefixes = shared_prefixes(fresh, self._prefix_cache.min_match, longest)
        try:
            self._store_prefixes(prefixes)
        except Exception:
            # A prompt that breaks the forward fails later, alone, in its own prefill.
            logger.exception("computing shared prefixes failed; each prompt prefills its own")
        return bool(prefixes)

    def _store_prefixes(self, prefixes: list[tuple[int, ...]]) -> None:
        for prefix in prefixes:
            cache = DynamicCache(config=self._model.config)
            positions = torch.arange(len(prefix), device=self._device).unsqueeze(0)
            self._prefill_logits(torch.tensor([prefix], device=self._device), None, positions, cache, keep=1)
            mask = torch.ones((1, len(prefix)), dtype=torch.long, device=self._device)
            self._prefix_cache.store(prefix, PaddedKVCache(cache, mask).row_kv(0))

    def _prefill_together(self, sequences: list[Sequence]) -> list[SequenceUpdate]:
        """One padded forward over the rest of each prompt (``prefill_layout``); then they join the batch.

        Nothing changes before the forward, the prompt scores and sampling have succeeded: ``bisect``
        may run it again.
        """
        prompts = self._prompt_operands(sequences)
        logits = self._prefill_logits(
            prompts.input_ids, prompts.attention_mask, prompts.positions, prompts.cache, prompts.keep
        )
        return self._finish_prefill(sequences, prompts, logits)

    def _prompt_operands(self, sequences: list[Sequence]) -> PromptForward:
        """The padded forward's operands over the rest of each prompt: its ids, mask, positions and a
        cache stacking what each already holds (a fresh one: the sequences' own stay as they are)."""
        rests = [s.request.prompt_token_ids[s.prefilled :] for s in sequences]
        past = max(s.prefilled for s in sequences)
        ids, mask_rows = prefill_layout([s.prefilled for s in sequences], rests)
        input_ids, mask = torch.tensor(ids, device=self._device), torch.tensor(mask_rows, device=self._device)
        cache = stack_left_padded([s.prefill_cache for s in sequences], past, self._model.config)
        keep_all = any(sequence.wants_prompt_scores for sequence in sequences)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, past:]
        # Only the last position is sampled: skip the rest of the LM head unless prompt logprobs need it.
        return PromptForward(input_ids, mask, positions, cache, keep=0 if keep_all else 1)

    def _finish_prefill(
        self, sequences: list[Sequence], prompts: PromptForward, logits: torch.Tensor
    ) -> list[SequenceUpdate]:
        """Score, sample and store the prompts whose last chunk ``prompts`` ran; they join the batch."""
        assert isinstance(prompts.cache, DynamicCache) and prompts.attention_mask is not None
        width = prompts.input_ids.shape[1]
        rests = [len(s.request.prompt_token_ids) - s.prefilled for s in sequences]
        prompt_scores = [
            s.score_prompt(logits[row, width - rest :], s.prefilled) if s.wants_prompt_scores else []
            for row, (s, rest) in enumerate(zip(sequences, rests, strict=True))
        ]
        choices = sample_rows(sequences, logits[:, -1, :], self._masks, self._sampler)
        for sequence, scores in zip(sequences, prompt_scores, strict=True):
            sequence.prompt_scores += scores
            sequence.prefilled, sequence.prefill_cache = len(sequence.request.prompt_token_ids), None
        batch = PaddedKVCache(prompts.cache, prompts.attention_mask)
        self._store_prompts(sequences, batch)
        self._join_batch(sequences, batch)
        return accept_rows(sequences, choices)

    def _prefill_chunk(self, chunk: PrefillChunk) -> SequenceUpdate | None:
        """Prefill a part of a long prompt (not its last) into its own cache; a failure fails it alone."""
        sequence = self._prefilling[chunk.request_id]
        try:
            self._prefill_into_own_cache(sequence, chunk)
        except Exception:
            logger.exception("sequence %s failed in prefill; failing it alone", chunk.request_id)
            del self._prefilling[chunk.request_id]
            return failed_update(chunk.request_id)
        return None

    def _prefill_into_own_cache(self, sequence: Sequence, chunk: PrefillChunk) -> None:
        if sequence.prefill_cache is None:
            sequence.prefill_cache = DynamicCache(config=self._model.config)
        tokens = sequence.request.prompt_token_ids[chunk.start : chunk.stop]
        logits = self._prefill_logits(
            torch.tensor([tokens], device=self._device),
            None,
            torch.arange(chunk.start, chunk.stop, device=self._device).unsqueeze(0),
            sequence.prefill_cache,
            # Nothing is sampled here: keep one position's logits unless prompt logprobs need them all.
            keep=0 if sequence.wants_prompt_scores else 1,
        )
        sequence.prefilled = chunk.stop
        if sequence.wants_prompt_scores:
            sequence.prompt_scores += sequence.score_prompt(logits[0], chunk.start)

    def _prefill_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        positions: torch.Tensor,
        cache: Cache,
        keep: int,
    ) -> torch.Tensor:
        """A prefill forward's logits of the last ``keep`` positions (0: all), ``cache`` updated: through
        the direct forward where the model has one (``direct_forward.py``), else the model's."""
        if self._direct is not None:
            return self._direct.prefill_logits(input_ids, attention_mask, positions, cache, keep)
        output = self._model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        return output.logits  # type: ignore[no-any-return]

    def _store_prompts(self, sequences: list[Sequence], batch: PaddedKVCache) -> None:
        """Keep each freshly prefilled prompt's KV (its row's real columns) for later prompts."""
        if not self._prefix_cache.is_enabled:
            return
        for row, sequence in enumerate(sequences):
            self._prefix_cache.store(sequence.request.prompt_token_ids, batch.row_kv(row))

    def _reads_whole_slots(self) -> bool:
        """Whether a new cache's steps read whole slots: eager half-precision steps on CPU, where
        oneDNN copies a strided operand (``slot_cache.py``); not where the fused kernel attends, which
        reads each row's own columns of the narrow view. Compiled and graphed steps keep the layouts
        they were built for; asked per cache, so a step that fell back to eager gets them."""
        return (
            self._device.type == "cpu"
            and self._model.dtype != torch.float32
            and self._compiled is None
            and self._model.config._attn_implementation != KERNEL_ATTENTION_NAME
        )

    def _join_batch(self, sequences: list[Sequence], cache: PaddedKVCache) -> None:
        """Append prefilled rows; rows that finish on their first token leave again at the step's end."""
        if self._kv is None:
            rows = self._scheduler.limits.max_batch_size
            self._kv = SlotKVCache(len(cache.layer_tensors()), rows, whole_slots=self._reads_whole_slots())
        self._kv.join(cache)
        self._rows.extend(sequences)

    def _drop_rows(self, request_ids: set[str]) -> None:
        kept = [index for index, row in enumerate(self._rows) if row.request_id not in request_ids]
        if len(kept) == len(self._rows):
            return
        keep = SlotKVCache.compacted(kept)  # the rows after a leaving one fill its slot, not all move down
        self._rows = [self._rows[index] for index in keep]
        if not keep and not isinstance(self._compiled, GraphedDecode):
            self._kv = None  # its storage goes back: an idle worker holds no cache
        elif self._kv is not None:
            self._kv.keep(keep)  # CUDA graphs read this storage: an idle GPU worker keeps it


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive float mask eager attention adds to its scores."""
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return additive.masked_fill_(~mask, torch.finfo(dtype).min)
