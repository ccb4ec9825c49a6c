"""The fused CPU decode attention computes what sdpa does, row by row whatever shares the batch,
over a slot cache's strided view; where it cannot be built, the engine attends with matmuls."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.engines import _tiny_config, batched_engine, request, run_to_end, sdpa_reference, tiny_llama
from worker.engine import cpu_kernels
from worker.engine.cpu_kernels import choices
from worker.engine.decode_attention import ATTENTION_NAME, KERNEL_ATTENTION_NAME, kernel_attention_forward


def _wide_llama() -> LlamaForCausalLM:
    """The tiny Llama with SmolLM2's head shape (head_dim 64, 3 query heads per key/value head): the
    kernels' vectorized paths, prefill included, serve it."""
    config = _tiny_config()
    config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim = 96, 6, 2, 64
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _slot_view(rows: int, kv_heads: int, columns: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The first ``columns`` of wider slots, as a slot cache hands them to attention: not contiguous."""
    return torch.randn(rows, kv_heads, columns + 37, head_dim, dtype=dtype)[:, :, :columns]


def test_make_setup_built_the_kernel_for_this_machine() -> None:
    assert cpu_kernels.kernels() is not None, cpu_kernels.describe()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
# head_dim 64 and 128 take the AVX-512 blocks, 8 and 80 the generic loop; 1 to 12 query heads per kv
# head: the values pass holds 1-8 heads' accumulators in registers (at head_dim 128 in one pass over
# the columns for up to 3 heads, two for 4-6, four for 7-8) and goes head by head beyond 8 (12).
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(9, 3, 64), (4, 4, 128), (14, 2, 64), (6, 2, 8), (4, 2, 80), (16, 4, 128), (32, 4, 128), (12, 1, 64)],
)
@pytest.mark.parametrize(("rows", "columns"), [(1, 1), (1, 17), (5, 40), (16, 300), (2, 1500)])
def test_kernel_computes_what_sdpa_does(
    dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, rows: int, columns: int
) -> None:
    torch.manual_seed(rows * columns + head_dim)
    query = torch.randn(rows, heads, 1, head_dim, dtype=dtype)
    key = _slot_view(rows, kv_heads, columns, head_dim, dtype)
    value = _slot_view(rows, kv_heads, columns, head_dim, dtype)
    lengths = torch.randint(1, columns + 1, (rows,))
    lengths[0] = columns
    mask = (torch.arange(columns)[None, :] < lengths[:, None])[:, None, None, :]
    output, weights = kernel_attention_forward(torch.nn.Module(), query, key, value, mask)
    assert weights is None and output.shape == (rows, 1, heads, head_dim) and output.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(
        output.float(), sdpa_reference(query, key, value, mask), atol=tolerance, rtol=tolerance
    )


def test_kernel_skips_masked_columns_inside_a_row() -> None:
    torch.manual_seed(0)
    query = torch.randn(3, 9, 1, 64)
    key, value = _slot_view(3, 3, 90, 64, torch.float32), _slot_view(3, 3, 90, 64, torch.float32)
    mask = torch.rand(3, 1, 1, 90) < 0.5
    mask[..., 0] = True
    output, _ = kernel_attention_forward(torch.nn.Module(), query, key, value, mask)
    torch.testing.assert_close(output, sdpa_reference(query, key, value, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_output_does_not_depend_on_the_rows_beside_it(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    query = torch.randn(12, 9, 1, 64, dtype=dtype)
    key, value = _slot_view(12, 3, 500, 64, dtype), _slot_view(12, 3, 500, 64, dtype)
    lengths = torch.randint(1, 501, (12,))
    mask = (torch.arange(500)[None, :] < lengths[:, None])[:, None, None, :]
    together, _ = kernel_attention_forward(torch.nn.Module(), query, key, value, mask)
    for row in (0, 5, 11):
        width = int(lengths[row])  # alone, and over only its own columns
        alone, _ = kernel_attention_forward(
            torch.nn.Module(),
            query[row : row + 1],
            key[row : row + 1, :, :width],
            value[row : row + 1, :, :width],
            mask[row : row + 1, ..., :width],
        )
        assert torch.equal(alone[0], together[row])


def test_the_engine_decodes_the_same_greedy_tokens_with_and_without_the_kernel() -> None:
    prompts = {"a": [5, 6, 7], "b": [9, 10, 11, 12, 13, 14, 15, 16, 17], "c": [20]}
    requests = [request(rid, prompt, max_new_tokens=40) for rid, prompt in prompts.items()]
    with_kernel, without = _wide_llama(), _wide_llama()
    kernel_engine, matmul_engine = (
        batched_engine(with_kernel),
        batched_engine(without, use_cpu_kernels=False),
    )
    assert with_kernel.config._attn_implementation == KERNEL_ATTENTION_NAME
    assert run_to_end(kernel_engine, requests) == run_to_end(matmul_engine, requests)


def test_where_the_kernels_cannot_be_built_the_engine_runs_torchs_ops(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_compiler(verbose: bool = False) -> None:
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(cpu_kernels, "build", no_compiler)
    with caplog.at_level(logging.WARNING):
        assert cpu_kernels.kernels.__wrapped__() is None
    assert "no C++ compiler here" in caplog.text and "torch's ops run in their place" in caplog.text
    monkeypatch.setattr(cpu_kernels, "kernels", lambda: None)
    model = tiny_llama()
    engine = batched_engine(model)
    assert model.config._attn_implementation == ATTENTION_NAME
    assert run_to_end(engine, [request("a", [5, 6, 7], max_new_tokens=8)])["a"]


class _CausalLayer(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int = 3) -> None:
        super().__init__()
        self.num_key_value_groups = groups  # what sdpa reads where the kernel does not serve


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 128), (14, 2, 64)])
# A whole prompt (causal, no mask), chunks over a past (a mask), one that is not a block multiple.
@pytest.mark.parametrize(("queries", "past"), [(1, 0), (70, 0), (512, 0), (64, 100), (37, 1500), (3, 90)])
def test_prefill_kernel_computes_what_sdpa_does(
    dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, queries: int, past: int
) -> None:
    torch.manual_seed(queries + past)
    keys = past + queries
    # Queries as transformers hands them over: [batch, heads, queries, dim] transposed from its projection.
    query = torch.randn(2, queries, heads, head_dim, dtype=dtype).transpose(1, 2)
    key, value = (torch.randn(2, kv_heads, keys, head_dim, dtype=dtype) for _ in range(2))
    causal = torch.arange(keys)[None, :] <= (past + torch.arange(queries))[:, None]
    mask = None if past == 0 else causal[None, None].expand(2, 1, queries, keys)
    output, weights = kernel_attention_forward(_CausalLayer(heads // kv_heads), query, key, value, mask)
    assert weights is None and output.shape == (2, queries, heads, head_dim) and output.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    expected = sdpa_reference(query, key, value, causal[None, None])
    torch.testing.assert_close(output.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dots", [True, False])
@pytest.mark.parametrize(("queries", "past"), [(70, 0), (64, 100)])
def test_bf16_prefill_computes_what_sdpa_does_in_dot_products_and_in_fp32(
    dots: bool, queries: int, past: int
) -> None:
    """Both variants ``choices`` picks between, called directly (the machine's pick aside)."""
    kernels = cpu_kernels.kernels()
    assert kernels is not None
    torch.manual_seed(queries)
    keys = past + queries
    query = torch.randn(1, queries, 9, 64, dtype=torch.bfloat16).transpose(1, 2)
    key, value = (torch.randn(1, 3, keys, 64, dtype=torch.bfloat16) for _ in range(2))
    causal = torch.arange(keys)[None, :] <= (past + torch.arange(queries))[:, None]
    mask = None if past == 0 else causal[None, None]
    output = kernels.prefill_attention(query, key, value, mask, 0.125, dots)
    expected = sdpa_reference(query, key, value, causal[None, None])
    torch.testing.assert_close(output.float(), expected, atol=1e-2, rtol=1e-2)


class _TimedKernels:
    """Kernels whose bf16 prefill takes the given seconds per variant."""

    def __init__(self, dots_seconds: float, fp32_seconds: float) -> None:
        self.seconds = {True: dots_seconds, False: fp32_seconds}
        self.clock = 0.0

    def prefill_attention(self, *args: object) -> None:
        self.clock += self.seconds[bool(args[-1])]


@pytest.mark.parametrize(
    ("dots_ms", "fp32_ms", "chosen"),
    [(2.1, 1.4, False), (1.4, 2.1, True), (1.45, 1.4, True)],  # Xeon w/o AMX, EPYC, a near tie
)
def test_bf16_prefill_runs_the_variant_measured_faster_here(
    monkeypatch: pytest.MonkeyPatch, dots_ms: float, fp32_ms: float, chosen: bool
) -> None:
    fake = _TimedKernels(dots_ms / 1e3, fp32_ms / 1e3)
    monkeypatch.setattr(choices.time, "perf_counter", lambda: fake.clock)
    monkeypatch.setattr(choices._Chosen, "bf16_dots", None)
    assert choices.bf16_dot_products(fake) is chosen  # type: ignore[arg-type]
    fake.seconds = {True: 1.0, False: 0.0}
    assert choices.bf16_dot_products(fake) is chosen  # type: ignore[arg-type]  # measured once


def test_prefill_kernel_honours_padding_in_the_mask() -> None:
    torch.manual_seed(3)
    query = torch.randn(2, 9, 40, 64).transpose(1, 2).contiguous().transpose(1, 2)
    key, value = torch.randn(2, 3, 40, 64), torch.randn(2, 3, 40, 64)
    causal = torch.arange(40)[None, :] <= torch.arange(40)[:, None]
    mask = causal[None, None].repeat(2, 1, 1, 1)
    mask[1, ..., :13] = False  # row 1 left-padded by 13: its real queries never see the padding
    mask[1, 0, :13, 0] = True  # (padding queries attend something, as transformers' masks have them)
    output, _ = kernel_attention_forward(_CausalLayer(), query, key, value, mask)
    torch.testing.assert_close(output, sdpa_reference(query, key, value, mask), atol=1e-5, rtol=1e-5)


def test_prefill_of_a_model_through_the_kernel_gives_sdpas_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = cpu_kernels.kernels()
    assert kernels is not None
    calls = []
    prefill = kernels.prefill_attention

    def counted(*args: object) -> torch.Tensor:
        calls.append(args)
        return prefill(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels, "prefill_attention", counted)
    torch.manual_seed(0)
    model, plain = _wide_llama(), _wide_llama()
    batched_engine(model)
    prompt = torch.randint(0, 100, (1, 300))
    with torch.inference_mode():
        ours, theirs = model(prompt).logits, plain(prompt).logits  # the plain model's attention is sdpa
    assert len(calls) == model.config.num_hidden_layers
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
