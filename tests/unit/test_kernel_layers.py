"""RMSNorm and the gated MLP in the CPU kernels: bit for bit what transformers' modules compute."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from shared.settings import WorkerSettings
from tests.engines import _tiny_config, batched_engine, request, run_to_end, tiny_llama
from worker.engine import cpu_kernels
from worker.model.backend import prepare_model
from worker.model.kernel_layers import KernelGatedMLP, KernelRMSNorm, use_kernel_layers

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _kernels() -> cpu_kernels.CpuKernels:
    kernels = cpu_kernels.kernels()
    assert kernels is not None, cpu_kernels.describe()
    return kernels


def _norm(width: int, dtype: torch.dtype) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(width, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(width) + 0.5)
    return norm.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
# Under one vector of width, tails, SmolLM2's 576, and a width long enough for the chained sums.
@pytest.mark.parametrize("width", [5, 64, 100, 576, 4096])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_the_norm_is_transformers_rmsnorm_bit_for_bit(dtype: torch.dtype, width: int, rows: int) -> None:
    torch.manual_seed(width + rows)
    norm = _norm(width, dtype)
    hidden = (torch.randn(rows, width) * 3).to(dtype)
    kernel = KernelRMSNorm(norm, _kernels())
    assert torch.equal(kernel(hidden), norm(hidden))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [64, 576])
def test_the_residual_add_in_the_norms_pass_is_the_add_then_the_norm(dtype: torch.dtype, width: int) -> None:
    torch.manual_seed(width)
    norm = _norm(width, dtype)
    residual, delta = torch.randn(2, 9, width).to(dtype), torch.randn(2, 9, width).to(dtype)
    normed, total = KernelRMSNorm(norm, _kernels()).add_forward(delta, residual)
    assert torch.equal(total, residual + delta)
    assert torch.equal(normed, norm(residual + delta))


def test_inputs_the_kernel_does_not_take_get_transformers_arithmetic() -> None:
    norm = _norm(64, torch.bfloat16)
    kernel = KernelRMSNorm(norm, _kernels())
    promoted = torch.randn(3, 64)  # fp32 rows into a bf16 norm: the module's own promotion
    strided = torch.randn(3, 64 * 2).to(torch.bfloat16)[:, ::2]
    assert torch.equal(kernel(promoted), norm(promoted))
    assert torch.equal(kernel(strided), norm(strided))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [32, 1536])
@pytest.mark.parametrize("rows", [1, 5, 600])
def test_silu_and_mul_is_torchs_silu_times_up_bit_for_bit(dtype: torch.dtype, width: int, rows: int) -> None:
    torch.manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * width) * 4).to(dtype)
    expected = nn.functional.silu(gate_up[:, :width]) * gate_up[:, width:]
    assert torch.equal(_kernels().silu_and_mul(gate_up), expected)


def _llama(hidden_act: str = "silu") -> LlamaForCausalLM:
    """``tiny_llama``'s shape and weights, with this activation."""
    config = _tiny_config()
    config.hidden_act = hidden_act
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prepared_model_runs_its_norms_and_mlps_in_the_kernels_with_the_same_logits(
    dtype: torch.dtype,
) -> None:
    stock, prepared = _llama().to(dtype), _llama().to(dtype)
    prepare_model(prepared, WorkerSettings())
    kinds = [type(module) for module in prepared.modules()]
    assert kinds.count(KernelRMSNorm) == 5 and kinds.count(KernelGatedMLP) == 2  # 2 per layer, the final norm
    assert LlamaRMSNorm not in kinds and LlamaMLP not in kinds
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    with torch.inference_mode():
        assert torch.equal(prepared(input_ids=prompt).logits, stock(input_ids=prompt).logits)


def test_greedy_tokens_are_the_same_with_and_without_the_kernel_layers() -> None:
    stock, prepared = tiny_llama().to(torch.bfloat16), tiny_llama().to(torch.bfloat16)
    prepare_model(stock, WorkerSettings(cpu_kernels=False))
    prepare_model(prepared, WorkerSettings())
    requests = [request("a", [5, 6, 7], max_new_tokens=24), request("b", [9, 10, 11, 12, 13])]
    assert run_to_end(batched_engine(prepared), requests) == run_to_end(batched_engine(stock), requests)


def test_what_the_kernels_do_not_implement_stays_as_it_is() -> None:
    gelu = _llama(hidden_act="gelu")
    prepare_model(gelu, WorkerSettings())
    kinds = [type(module) for module in gelu.modules()]
    assert KernelGatedMLP not in kinds and LlamaMLP in kinds  # another activation
    assert kinds.count(KernelRMSNorm) == 5
    turned_off = _llama()
    prepare_model(turned_off, WorkerSettings(cpu_kernels=False))
    assert not any(isinstance(module, KernelRMSNorm | KernelGatedMLP) for module in turned_off.modules())
    compiled = _llama()
    prepare_model(compiled, WorkerSettings(compile=True))  # compiled graphs trace torch's ops
    assert not any(isinstance(module, KernelRMSNorm | KernelGatedMLP) for module in compiled.modules())
    assert use_kernel_layers(_llama(), _kernels()) == 5  # gate and up not fused: the norms only
    assert use_kernel_layers(_llama(), None) == 0  # no build here: nothing changes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "seq"), [(1, 1), (9, 1), (2, 37)])
@pytest.mark.parametrize("head_dim", [8, 48, 64, 128])
def test_the_rotation_is_transformers_apply_rotary_pos_emb_bit_for_bit(
    dtype: torch.dtype, rows: int, seq: int, head_dim: int
) -> None:
    torch.manual_seed(head_dim + rows)
    heads, kv_heads = 6, 2
    config = LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads, head_dim=head_dim)
    # As a decoder layer holds them: heads of a fused q/k/v product, viewed and transposed (strided).
    fused = (torch.randn(rows, seq, (heads + 2 * kv_heads) * head_dim) * 2).to(dtype)
    query = fused[..., : heads * head_dim].view(rows, seq, heads, head_dim).transpose(1, 2)
    key = fused[..., heads * head_dim : (heads + kv_heads) * head_dim].view(rows, seq, kv_heads, head_dim)
    key = key.transpose(1, 2)
    positions = torch.randint(0, 4000, (rows, seq))
    cos, sin = LlamaRotaryEmbedding(config)(fused, positions)
    expected = apply_rotary_pos_emb(query, key, cos, sin)
    rotated = _kernels().rotary(query, key, cos, sin)
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(rotated, expected, strict=True))
