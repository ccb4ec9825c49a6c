"""Fused q/k/v and gate/up projections compute what the separate Linears do, in any model that has them."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.engines import _tiny_config, batched_engine, request, run_to_end, tiny_llama
from worker.model.fused_projections import FusedGroup, ProjectionSlice, fuse_projections
from worker.model.onednn_linear import PackedLinear, pack_linear_layers


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits  # type: ignore[no-any-return]


def test_a_fused_llama_gives_the_same_logits_and_greedy_tokens() -> None:
    ids = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])
    plain, fused = tiny_llama(), tiny_llama()
    assert fuse_projections(fused) == 2 * _tiny_config().num_hidden_layers  # attention and MLP per layer
    attention = fused.model.layers[0].self_attn
    assert isinstance(attention.q_proj, ProjectionSlice) and isinstance(attention.qkv_fused, FusedGroup)
    torch.testing.assert_close(_logits(fused, ids), _logits(plain, ids), rtol=1e-5, atol=1e-5)
    requests = [request("a", [5, 6, 7], max_new_tokens=16), request("b", [9, 10, 11, 12], max_new_tokens=16)]
    assert run_to_end(batched_engine(fused), requests) == run_to_end(batched_engine(plain), requests)


def test_biased_projections_fuse_with_their_biases_and_are_packed_afterwards() -> None:
    config = Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    plain = Qwen2ForCausalLM(config).eval()
    fused = Qwen2ForCausalLM(config).eval()
    fused.load_state_dict(plain.state_dict())
    assert plain.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v carry biases
    fuse_projections(fused)
    pack_linear_layers(fused)
    assert isinstance(fused.model.layers[0].self_attn.qkv_fused.linear, PackedLinear)
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(_logits(fused, ids), _logits(plain, ids), rtol=1e-4, atol=1e-4)


def test_groups_that_differ_are_left_alone_and_each_input_gets_its_own_product() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj = nn.Linear(8, 8), nn.Linear(8, 4)
            self.v_proj = nn.Linear(8, 4, bias=False)
            self.gate_proj, self.up_proj = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False)

    block = Block()
    gate, up = block.gate_proj, block.up_proj
    assert fuse_projections(block) == 1  # q/k/v mix biased and unbiased Linears
    assert isinstance(block.q_proj, nn.Linear) and isinstance(block.gate_proj, ProjectionSlice)
    first, second = torch.randn(2, 8), torch.randn(2, 8)
    with torch.inference_mode():
        for x in (first, second, first):
            torch.testing.assert_close(block.gate_proj(x), gate(x))
            torch.testing.assert_close(block.up_proj(x), up(x))
            assert block.gate_up_fused._output is None  # read by both slices: nothing held between forwards
        torch.testing.assert_close(block.up_proj(second), up(second))  # a slice alone, in any order
