"""Sampling a step's rows together must give each row what its own processor list and generator give it."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LogitsProcessor, TopPLogitsWarper

from tests.engines import request
from worker.engine.batch_sampling import BatchSampler, greedy_tokens, takes_own_path
from worker.engine.draws import draw_tokens
from worker.engine.isolation import sample_rows
from worker.engine.sampling import NUCLEUS_CANDIDATES, choose_token, nucleus
from worker.engine.sequence import Sequence

VOCAB = 1000
EOS = 7
CPU = torch.device("cpu")

SETTINGS: dict[str, dict[str, object]] = {
    "greedy": {},
    "logit_bias": {"logit_bias": ((3, 5.0), (11, -100.0), (999, 2.5))},
    "repetition": {"repetition_penalty": 1.8},
    "repetition_below_one": {"repetition_penalty": 0.7},
    "presence_frequency": {"presence_penalty": 1.5, "frequency_penalty": 0.75},
    "negative_frequency": {"frequency_penalty": -0.5},
    "min_tokens": {"min_new_tokens": 10},
    "greedy_penalised": {"repetition_penalty": 1.3, "presence_penalty": 0.5, "logit_bias": ((5, 1.0),)},
    "temperature": {"temperature": 0.7, "seed": 1},
    "top_k": {"temperature": 0.8, "top_k": 5, "seed": 2},
    "top_k_past_vocab": {"temperature": 1.0, "top_k": 10**6, "seed": 3},
    "top_p": {"temperature": 1.2, "top_p": 0.5, "seed": 4},
    "top_p_tiny": {"temperature": 1.0, "top_p": 1e-9, "seed": 5},
    "min_p": {"temperature": 1.0, "min_p": 0.2, "seed": 6},
    "unseeded": {"temperature": 0.9, "top_p": 0.9},
    "everything": {
        "temperature": 0.6,
        "top_k": 40,
        "top_p": 0.8,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
        "presence_penalty": 0.4,
        "frequency_penalty": 0.3,
        "min_new_tokens": 3,
        "logit_bias": ((EOS, 3.0),),
        "seed": 7,
    },
}


def sequence(name: str, settings: dict[str, object], generated: int = 4) -> Sequence:
    """A started sequence with a prompt and ``generated`` tokens already out (repeats included)."""
    prompt = [(17 * i + len(name)) % VOCAB for i in range(12)]
    row = Sequence.start(request(name, prompt, max_new_tokens=100, eos=[EOS], **settings), CPU)
    for step in range(generated):
        row.token_ids.append(prompt[step % 3] if step % 2 else (step * 31) % VOCAB)
        row.generated += 1
    return row


def random_logits(rows: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn((rows, VOCAB), generator=generator) * 4).to(dtype)


def reference_scores(row: Sequence, logits: torch.Tensor) -> torch.Tensor:
    """The per-row path's processed scores of one row ([1, vocab])."""
    return row.processors(torch.tensor([row.token_ids]), logits.float())  # type: ignore[no-any-return]


def test_an_all_greedy_batch_picks_each_rows_argmax() -> None:
    rows = [sequence(f"g{i}", {}) for i in range(32)]
    logits = random_logits(32)
    tokens = BatchSampler().choose(rows, logits)
    assert tokens == [int(logits[i : i + 1].argmax(dim=-1).item()) for i in range(32)]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_parameter_alone_processes_scores_as_the_per_row_processors(name: str) -> None:
    rows = [sequence(name, SETTINGS[name], generated=generated) for generated in (0, 1, 6)]
    logits = random_logits(len(rows), seed=len(name))
    processed = BatchSampler().scores(rows, logits)
    for index, row in enumerate(rows):
        assert torch.equal(processed[index : index + 1], reference_scores(row, logits[index : index + 1]))


def test_a_mixed_batch_processes_every_row_as_its_own_processors() -> None:
    rows = [sequence(name, settings) for name, settings in SETTINGS.items()]
    logits = random_logits(len(rows), seed=1, dtype=torch.float32)
    processed = BatchSampler().scores(rows, logits)
    for index, row in enumerate(rows):
        assert torch.equal(processed[index : index + 1], reference_scores(row, logits[index : index + 1]))
    # Warpers really act on sampled rows only: greedy rows' distributions stay whole.
    assert bool(torch.isinf(processed[list(SETTINGS).index("top_k")]).sum() == VOCAB - 5)
    assert bool(torch.isfinite(processed[list(SETTINGS).index("greedy_penalised")]).all())


def test_batched_tokens_match_the_per_row_path_for_greedy_and_seeded_rows() -> None:
    names = [name for name in SETTINGS if name != "unseeded"]  # a fresh random seed per sequence
    batched_rows = [sequence(name, SETTINGS[name]) for name in names]
    alone_rows = [sequence(name, SETTINGS[name]) for name in names]
    for step in range(5):
        logits = random_logits(len(names), seed=100 + step)
        together = BatchSampler().choose(batched_rows, logits)
        alone = [
            choose_token(logits[i : i + 1], torch.tensor([row.token_ids]), row.processors, row.generator)  # type: ignore[arg-type]
            for i, row in enumerate(alone_rows)
        ]
        assert together == alone
        for row, other, token in zip(batched_rows, alone_rows, together, strict=True):
            assert token is not None
            row.token_ids.append(token)
            other.token_ids.append(token)


def seeded_run(position: int, others: list[str], steps: int = 6) -> list[int]:
    """The seeded row's tokens over ``steps`` steps, at ``position`` among fresh rows ``others``."""
    sampler = BatchSampler()
    rows = [sequence(name, SETTINGS[name]) for name in others]
    seeded = sequence("seeded", {"temperature": 1.0, "top_p": 0.95, "presence_penalty": 0.5, "seed": 42})
    rows.insert(position, seeded)
    produced = []
    for step in range(steps):
        # The seeded row always sees the same logits, whatever row it is.
        logits = random_logits(len(rows), seed=1000 + step)
        logits[position] = random_logits(1, seed=step)[0]
        tokens = sampler.choose(rows, logits)
        for row, token in zip(rows, tokens, strict=True):
            assert token is not None
            row.token_ids.append(token)
        produced.append(tokens[position])
    return produced


def test_a_seeded_row_draws_the_same_whatever_shares_the_batch_and_wherever_it_sits() -> None:
    alone = seeded_run(0, [])
    assert seeded_run(0, ["unseeded", "top_k", "greedy"]) == alone
    assert seeded_run(3, ["unseeded", "top_k", "greedy", "everything", "min_p"]) == alone
    assert seeded_run(1, ["greedy_penalised", "repetition"]) == alone


def test_sampled_rows_draw_from_their_processed_distribution() -> None:
    row = sequence("top_k", {"temperature": 1.0, "top_k": 3, "seed": 9})
    logits = torch.full((1, VOCAB), -10.0)
    logits[0, [10, 20, 30]] = torch.tensor([2.0, 1.0, 0.0])
    draws = [BatchSampler().choose([row], logits)[0] for _ in range(3000)]
    assert set(draws) == {10, 20, 30}
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.0]), dim=0).tolist()
    for token, probability in zip((10, 20, 30), expected, strict=True):
        assert math.isclose(draws.count(token) / len(draws), probability, abs_tol=0.03)


def test_token_counts_kept_across_steps_and_compositions_equal_a_fresh_count() -> None:
    kept = BatchSampler()
    rows = [sequence(name, SETTINGS[name]) for name in ("repetition", "presence_frequency", "everything")]
    for step in range(4):
        if step == 2:  # a row leaves and a new one joins: a new composition
            rows = [rows[0], sequence("joined", SETTINGS["negative_frequency"]), rows[2]]
        logits = random_logits(len(rows), seed=step, dtype=torch.float32)
        assert torch.equal(kept.scores(rows, logits), BatchSampler().scores(rows, logits))
        for row, token in zip(rows, kept.choose(rows, logits), strict=True):
            assert token is not None
            row.token_ids.append(token)


class RecordingSampler(BatchSampler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def choose(self, rows: list[Sequence], logits: torch.Tensor) -> list[int | None]:
        self.seen += [row.request_id for row in rows]
        return super().choose(rows, logits)


def test_rows_needing_rarer_processors_take_the_per_row_path_alone() -> None:
    rare = {
        "ngram": {"no_repeat_ngram_size": 2},
        "typical": {"temperature": 1.0, "typical_p": 0.5, "seed": 1},
        "bias_past_vocab": {"logit_bias": ((VOCAB + 5, 1.0),)},
    }
    assert all(takes_own_path(sequence(n, s).request.sampling, VOCAB) for n, s in rare.items())
    assert not takes_own_path(sequence("greedy_typical", {"typical_p": 0.5}).request.sampling, VOCAB)
    rows = [
        sequence("greedy", {}),
        *(sequence(n, s) for n, s in rare.items()),
        sequence("top_p", SETTINGS["top_p"]),
    ]
    sampler = RecordingSampler()
    choices = sample_rows(rows, random_logits(len(rows)), sampler=sampler)
    assert sampler.seen == ["greedy", "top_p"]
    assert [choice is None for choice in choices] == [False, False, False, True, False]


class BrokenSampler(BatchSampler):
    def choose(self, rows: list[Sequence], logits: torch.Tensor) -> list[int | None]:
        raise RuntimeError("a batched sampling bug")


def test_when_sampling_together_raises_each_row_samples_alone_with_the_same_tokens() -> None:
    names = [name for name in SETTINGS if name != "unseeded"]
    logits = random_logits(len(names), seed=3)
    together = sample_rows([sequence(n, SETTINGS[n]) for n in names], logits)
    alone = sample_rows([sequence(n, SETTINGS[n]) for n in names], logits, sampler=BrokenSampler())
    assert alone == together


class Raising(LogitsProcessor):
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        raise ValueError("a processor on values nobody foresaw")


def test_a_row_whose_sampling_raises_fails_alone() -> None:
    names = ["greedy", "top_k", "everything"]
    logits = random_logits(len(names) + 2, seed=4)
    expected = sample_rows([sequence(n, SETTINGS[n]) for n in names], logits[[0, 2, 4]])
    broken = sequence("ngram", {"no_repeat_ngram_size": 2})
    broken.processors.append(Raising())
    # A sampled row whose logits hold no valid distribution fails alone too, on the per-row path.
    empty = sequence("empty", {"temperature": 1.0, "seed": 3})
    logits[3] = float("nan")
    rows = [sequence(n, SETTINGS[n]) for n in names]
    choices = sample_rows([rows[0], broken, rows[1], empty, rows[2]], logits)
    assert choices[1] is None and choices[3] is None
    assert [choices[0], choices[2], choices[4]] == expected


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_the_nucleus_keeps_what_transformers_top_p_keeps(top_p: float) -> None:
    logits = random_logits(16, seed=int(top_p * 1000), dtype=torch.float32)
    logits[0] = torch.linspace(0, 0.01, VOCAB)  # nearly flat: its nucleus is past the candidates
    logits[1, :NUCLEUS_CANDIDATES] = 20.0  # ties inside the candidates
    cutoffs = torch.full((16, 1), top_p)
    ours = nucleus(logits, cutoffs)
    theirs = TopPLogitsWarper(top_p)(torch.zeros((16, 1), dtype=torch.long), logits)  # type: ignore[arg-type]
    others = [0, *range(2, 16)]
    assert torch.equal(ours[others], theirs[others])
    # Which of equally likely tokens stays is arbitrary in both; how many stay is not.
    assert int(ours[1].isfinite().sum()) == int(theirs[1].isfinite().sum())
    if top_p > NUCLEUS_CANDIDATES / VOCAB:  # the flat row's nucleus is past the candidates: a full sort
        assert int(ours[0].isfinite().sum()) > NUCLEUS_CANDIDATES


def test_a_draw_takes_the_token_at_its_uniforms_quantile_across_blocks() -> None:
    probabilities = torch.zeros((1, VOCAB))  # 1000 tokens: three whole blocks and a shorter one
    probabilities[0, [5, 300, 700, 999]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    uniforms = torch.tensor([0.0, 0.05, 0.15, 0.35, 0.65, 1 - 2**-53], dtype=torch.float64)
    tokens, valid = draw_tokens(probabilities.expand(len(uniforms), VOCAB), uniforms)
    assert tokens.tolist() == [5, 5, 300, 700, 999, 999]
    assert bool(valid.all())
    _, valid = draw_tokens(torch.tensor([[float("nan"), 0.5], [0.0, 0.0]]), torch.tensor([0.5, 0.5]))
    assert valid.tolist() == [False, False]


@pytest.mark.parametrize("rows", [0, 1, 3, 32])
@pytest.mark.parametrize("vocab", [128, 49_152, 1_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_blocked_argmax_picks_what_torch_argmax_picks(rows: int, vocab: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(rows * vocab)
    scores = torch.randn(rows, vocab, generator=generator).to(dtype)
    if rows >= 3:
        scores[0, [5, vocab - 1]] = float("nan")  # the first NaN wins, as in argmax
        scores[1] = float("-inf")  # nothing finite: index 0
        scores[2, [vocab // 3, vocab // 2, vocab - 1]] = 1e4  # ties: the first
    if rows == 32:
        scores[4:8] = torch.round(scores[4:8])  # many ties within and across blocks
    assert torch.equal(greedy_tokens(scores), scores.argmax(dim=-1))
    assert torch.equal(greedy_tokens(scores[:, : vocab - 1]), scores[:, : vocab - 1].argmax(dim=-1))
