"""oneDNN packed Linear layers compute what nn.Linear does; only plain fp32/bf16 CPU Linears are swapped;
wide bf16 inputs multiply in fp32 from the row count measured faster."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from worker.model import onednn_linear
from worker.model.onednn_linear import (
    PRIMITIVE_CACHE_ENTRIES,
    PackedLinear,
    bound_primitive_caches,
    can_pack,
    pack_linear_layers,
    wide_rows,
)


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


def _bf16_layer() -> PackedLinear:
    torch.manual_seed(1)
    linear = nn.Linear(64, 96).to(torch.bfloat16)
    return PackedLinear(linear)


def test_a_wide_bf16_input_multiplies_the_bf16_operands_in_fp32_and_rounds_once() -> None:
    assert torch.ops.mkldnn._is_mkldnn_bf16_supported()  # the pinned CPU build of torch runs bf16
    linear = nn.Linear(64, 96).to(torch.bfloat16)
    layer = PackedLinear(linear)
    hidden = torch.randn(2, 300, 64).to(torch.bfloat16)
    with torch.inference_mode():
        narrow = layer(hidden)
        layer.wide_rows = 256
        wide = layer(hidden)
        two_rows = layer(hidden[:, :1])  # under wide_rows: the packed bf16 product
    exact = nn.functional.linear(hidden.float(), linear.weight.float(), linear.bias.float())
    assert wide.dtype == torch.bfloat16 and wide.shape == (2, 300, 96)
    assert torch.equal(wide, exact.to(torch.bfloat16))
    torch.testing.assert_close(wide, narrow, rtol=2e-2, atol=2e-2)  # oneDNN's bf16 sums in another order
    assert torch.equal(two_rows, narrow[:, :1])


def _scripted(monkeypatch: pytest.MonkeyPatch, seconds: list[float]) -> None:
    """``median_seconds`` answers these in turn: (packed, fp32) for each row count tried."""
    answers = iter(seconds)
    monkeypatch.setattr(onednn_linear, "median_seconds", lambda run: next(answers))


@pytest.mark.parametrize(
    ("timings", "expected"),
    [
        # (packed bf16, fp32) at 128, 256, 512 rows
        ([(2.5, 2.7), (5.1, 4.2), (10.4, 7.3)], 256),  # measured on a 2-core Xeon without AMX
        ([(1.0, 2.0), (2.0, 4.0), (4.0, 8.0)], None),  # bf16 the faster everywhere (AMX, EPYC)
        ([(3.0, 2.0), (6.0, 4.0), (12.0, 8.0)], 128),
        ([(3.0, 2.0), (4.0, 4.0), (12.0, 8.0)], 512),  # a tie in between: from where it always wins
        ([(2.0, 1.9), (4.0, 3.8), (8.0, 7.6)], None),  # within the margin: a noisy gain is no gain
    ],
)
def test_wide_rows_is_the_fewest_rows_from_which_fp32_measures_clearly_faster(
    monkeypatch: pytest.MonkeyPatch, timings: list[tuple[float, float]], expected: int | None
) -> None:
    _scripted(monkeypatch, list(itertools.chain.from_iterable(timings)))
    assert wide_rows(_bf16_layer()) == expected


def test_packing_a_bf16_model_sets_the_measured_wide_rows_on_every_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert torch.ops.mkldnn._is_mkldnn_bf16_supported()
    measured = []
    monkeypatch.setattr(onednn_linear, "wide_rows", lambda layer: measured.append(layer) or 256)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16), nn.Linear(16, 32)).to(torch.bfloat16)
    pack_linear_layers(model)
    assert [module.wide_rows for module in model] == [256, 256, 256]
    assert measured == [model[0]]  # once, on the most common shape
    fp32 = _model()
    pack_linear_layers(fp32)
    assert fp32[0].wide_rows is None  # fp32 models have nothing to widen


# A child process: oneDNN and ideep read their cache capacity once, at their first use.
_ROW_COUNTS_PROBE = """
import re, sys
from pathlib import Path
import torch
from torch import nn
from worker.model.onednn_linear import PackedLinear, bound_primitive_caches
if sys.argv[1] == "bound":
    bound_primitive_caches()
def resident_mb():
    return int(re.search(r"VmRSS:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)) >> 10
layer, rows = PackedLinear(nn.Linear(256, 512, bias=False)), torch.randn(1300, 256)
with torch.inference_mode():
    layer(rows[:3])
    before = resident_mb()
    for count in range(300, 1300):  # a prefill's token count: new at almost every step
        layer(rows[:count])
print(resident_mb() - before)
"""


def _growth_mb(mode: str) -> int:
    environment = {**os.environ, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"}
    if mode == "bound":  # what the worker sets where the environment does not
        del environment["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], environment["LRU_CACHE_CAPACITY"]
    result = subprocess.run(
        [sys.executable, "-c", _ROW_COUNTS_PROBE, mode],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**environment, "OMP_NUM_THREADS": "2"},
        cwd=Path(__file__).resolve().parents[2],
    )
    return int(result.stdout.split()[-1])


def test_a_thousand_prefill_sizes_leave_a_bounded_primitive_cache_not_one_per_size() -> None:
    # torch's default 1,024 entries per cache: 849 MB here; bounded to 64: 184 MB.
    assert _growth_mb("bound") * 2 < _growth_mb("default")


def test_the_environment_chooses_the_primitive_cache_sizes_where_it_sets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environment = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8"}
    monkeypatch.setattr(onednn_linear.os, "environ", environment)
    bound_primitive_caches()
    assert environment == {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8",
        "LRU_CACHE_CAPACITY": str(PRIMITIVE_CACHE_ENTRIES),
    }
