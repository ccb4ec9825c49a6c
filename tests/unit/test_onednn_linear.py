"""oneDNN packed Linear layers compute what nn.Linear does; only plain fp32/bf16 CPU Linears are swapped."""

from __future__ import annotations

import torch
from torch import nn

from worker.model.onednn_linear import PackedLinear, can_pack, pack_linear_layers


class _Custom(nn.Linear):
    """A Linear subclass (LoRA-like layers are such): its forward may differ, so it is left alone."""


def _model() -> nn.Module:
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(32, 8, bias=False))
    return nn.Sequential(nn.Linear(16, 32), nn.SiLU(), inner, _Custom(8, 4))


def test_packed_layers_give_the_same_outputs_for_2d_and_3d_inputs() -> None:
    model = _model()
    assert can_pack(model)  # the pinned CPU build of torch has oneDNN
    inputs = [torch.randn(5, 16), torch.randn(3, 7, 16)]
    with torch.inference_mode():
        expected = [model(x) for x in inputs]
        assert pack_linear_layers(model) == 2
        got = [model(x) for x in inputs]
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    assert type(model[3]) is _Custom
    for want, have in zip(expected, got, strict=True):
        assert have.shape == want.shape
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5)


def test_bfloat16_layers_are_packed_where_onednn_runs_bf16() -> None:
    model = _model().to(torch.bfloat16)
    assert can_pack(model) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if not can_pack(model):
        return
    x = torch.randn(6, 16, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = model(x)
        pack_linear_layers(model)
        got = model(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_only_float32_and_bfloat16_models_on_cpu_are_packed() -> None:
    assert not can_pack(_model().to(torch.float16))
    assert not can_pack(nn.Sequential(nn.SiLU()))  # no parameters at all
