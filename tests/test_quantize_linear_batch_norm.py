"""The quantize step's linear + batch-norm fold as rules (``quantize_step.fuse_linear_bn_``).

``prepare_pt2e`` calls torchao's ``_fuse_linear_bn_`` right after the convolutions' fold;
it checks its operands no better: a batch-norm operand that is a graph input crashes the
quantize step, and two linears sharing one weight, each with its batch norm, quantize
another model (the second fold is a "fake fuse" that drops its batch norm). Under
``xnnpack_adapter.install()`` both are declined with their reasons and quantize within int8
tolerance of eager; the plain case folds as stock does (the converted model computes
stock's outputs exactly); a rank-3 input, which stock skips with a warning, is declined.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fusionkit.backends import quantize_step, xnnpack_adapter

pytest.importorskip("torchao")


class LinearBn(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        features = 6 if mode == "rank3" else 4
        self.lin, self.bn, self.bn2 = nn.Linear(6, features), nn.BatchNorm1d(4), nn.BatchNorm1d(4)
        torch.manual_seed(1)
        with torch.no_grad():
            for b in (self.bn, self.bn2):
                b.running_mean.uniform_(-0.5, 0.5)
                b.running_var.uniform_(0.5, 2.0)
                b.weight.uniform_(0.5, 1.5)
                b.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> object:
        bn = self.bn
        if self.mode == "input":
            return F.batch_norm(self.lin(x), bn.running_mean, bn.running_var, extra[0], bn.bias,
                                False, 0.1, 1e-5)
        if self.mode == "shared":
            return bn(self.lin(x)), self.bn2(F.linear(x * 0.5, self.lin.weight, self.lin.bias))
        return bn(self.lin(x))


def _inputs(mode: str) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(5, 4, 6) if mode == "rank3" else torch.randn(5, 6)
    return (x, torch.rand(4) + 0.5) if mode == "input" else (x,)


def _quantized(model: nn.Module, inputs: tuple[torch.Tensor, ...], installed: bool
               ) -> tuple[torch.fx.GraphModule, object]:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gm = torch.export.export(copy.deepcopy(model), inputs).module(check_guards=False)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    if installed:
        with xnnpack_adapter.install():
            prepared = prepare_pt2e(gm, quantizer)  # type: ignore[arg-type]
    else:
        prepared = prepare_pt2e(gm, quantizer)  # type: ignore[arg-type]
    prepared(*inputs)
    report = prepared.meta.get(quantize_step.META_KEY)
    return convert_pt2e(prepared), report


def _error(got: object, want: object) -> float:
    pairs = zip(got if isinstance(got, tuple) else (got,),  # type: ignore[arg-type]
                want if isinstance(want, tuple) else (want,), strict=True)
    return max(float((a - b).abs().max()) for a, b in pairs)


@pytest.mark.parametrize("mode", ["param", "input", "shared", "rank3"])
def test_linear_batch_norm_fold(mode: str) -> None:
    model = LinearBn(mode).eval()
    inputs = _inputs(mode)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        want = model(*inputs)
    tolerance = 4 * max(float(t.abs().max()) for t in
                        (want if isinstance(want, tuple) else (want,))) / 127
    ours, report = _quantized(model, inputs, installed=True)
    with torch.no_grad():
        got = ours(*inputs)
    assert _error(got, want) <= tolerance, report
    steps = {"param": set(), "input": {"custom:optional_affine_is_constant"},
             "shared": {"custom:weight_not_shared"}, "rank3": {"custom:same_dimension"}}
    assert {d.step for d in report.declined} == steps[mode], report  # type: ignore[attr-defined]
    assert len(report.folded) == (mode == "param"), report  # type: ignore[attr-defined]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    if mode == "input":  # stock: torchao's fold reads the graph input as an attribute
        with pytest.raises(ValueError, match="Expected get_attr node, got placeholder"):
            _quantized(model, inputs, installed=False)
        return
    stock, _ = _quantized(model, inputs, installed=False)
    with torch.no_grad():
        stock_got = stock(*inputs)
    if mode == "shared":  # the second batch norm dropped: another model (measured 0.62)
        assert _error(stock_got, want) > 10 * tolerance
    else:  # the same fold (plain) or the same skip (rank 3): stock's outputs exactly
        assert _error(stock_got, got) == 0.0
