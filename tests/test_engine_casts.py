"""Pass-throughs preserve values (issue 14, seen failure #4).

``through(CASTS, x)`` used to skip any cast, so a narrowing round trip
(fp32 -> fp16 -> fp32) vanished into the fused op, which then computed on values
the model never saw. Now only casts that keep every value are skipped; a rule
opts into narrowing casts with ``narrowing=True``.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from models import export_edge
from torch import nn

from fusionkit import CASTS, capture, find_matches, op, through
from fusionkit.match.pattern import widens
from fusionkit.passes.rms_norm import rms_norm_rule
from fusionkit.rule import Rule, replace_with

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def _hard_values(dtype: torch.dtype) -> torch.Tensor:
    """Values of ``dtype`` that a lossy conversion changes: extremes, the smallest
    subnormal, a full mantissa, large odd integers."""
    if dtype == torch.bool:
        return torch.tensor([False, True])
    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        vals = [fi.max, fi.min, fi.tiny, fi.smallest_normal / 2 ** 3, 1 + fi.eps, -(1 + fi.eps),
                1 / 3, 0.1, 12345.678]
        return torch.tensor(vals, dtype=torch.float64).to(dtype)
    ii = torch.iinfo(dtype)
    return torch.tensor([ii.min, ii.max, ii.max - 1, 0, 1], dtype=dtype)


@pytest.mark.parametrize("src,dst", list(itertools.product(FLOATS + INTS, FLOATS + INTS)),
                         ids=lambda d: str(d).removeprefix("torch."))
def test_widens_means_every_value_survives(src: torch.dtype, dst: torch.dtype) -> None:
    vals = _hard_values(src)
    with torch.no_grad():
        back = vals.to(dst).to(src)
        same = bool(torch.equal(back, vals)) and bool(
            torch.equal(vals.to(dst).to(torch.float64), vals.to(torch.float64)))
    if widens(src, dst):
        assert same, f"{src} -> {dst} is called widening but changes {vals} to {back}"
    elif src != dst:
        assert not same, f"{src} -> {dst} keeps these values: add a harder one or call it widening"


class RoundTrip(nn.Module):
    """relu of ``x`` after casts through ``dtypes`` (the input is fp32)."""

    def __init__(self, *dtypes: torch.dtype) -> None:
        super().__init__()
        self.dtypes = dtypes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for d in self.dtypes:
            x = x.to(d)
        return torch.relu(x)


def _bound_x(model: nn.Module, narrowing: bool) -> torch.fx.Node:
    ep = export_edge(model, (torch.randn(2, 8),))
    pattern = op("aten.relu.default", through(CASTS, capture("x"), narrowing=narrowing))
    # what the pattern binds is under test; the replacement (relu of the value before the
    # casts) has the wrong dtype, so building it, as find_matches does, would refuse it
    (m,) = find_matches(ep, [Rule("r", pattern, replace_with("aten.relu.default",
                                                             capture("x")))],
                        check_replacements=False).accepted
    return m.captures["x"]


def test_a_narrowing_round_trip_is_not_passed_through() -> None:
    x = _bound_x(RoundTrip(torch.float16, torch.float32), narrowing=False)
    assert x.op == "call_function" and x.meta["val"].dtype == torch.float16  # stops at the fp16
    assert _bound_x(RoundTrip(torch.float16, torch.float32), narrowing=True).op == "placeholder"


def test_widening_casts_are_passed_through() -> None:
    assert _bound_x(RoundTrip(torch.float64), narrowing=False).op == "placeholder"
    model = RoundTrip(torch.float16, torch.float32, torch.float64)  # fp16 -> fp32 -> fp64 widen
    x = _bound_x(model, narrowing=False)
    assert x.meta["val"].dtype == torch.float16


class RoundTripNorm(nn.Module):
    """An RMSNorm whose input went through fp16 and back (values rounded to fp16)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float16).to(torch.float32)
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_rms_norm_does_not_swallow_a_narrowing_round_trip(vulkan_ops: None) -> None:
    ep = export_edge(RoundTripNorm(), (torch.randn(2, 8),))
    (m,) = find_matches(ep, [rms_norm_rule()]).accepted
    # the fused op reads the values after the round trip (the fp32 cast back of the fp16
    # value), not the raw input the narrowing cast rounded
    x = m.captures["x"]
    assert x.op == "call_function" and x.meta["val"].dtype == torch.float32
    assert x.args[0].meta["val"].dtype == torch.float16
