"""QAT's convolution + batch-norm rewrite as rules (:mod:`fusionkit.backends.quantize_step_qat`).

Held apart from the zoo test (``test_quantize_qat_conv_batch_norm``): the rule's own
replacement against eager training, and the literal cases torchao's rewrite ignores
(``eps``, ``momentum``, a grouped transposed convolution), stock beside fusionkit.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fusionkit import run_rules
from fusionkit.backends import quantize_step, quantize_step_qat, xnnpack_adapter
from fusionkit.integration.graph_module_program import lift
from fusionkit.passes.families.conv_batch_norm_qat import rules

pytest.importorskip("torchao")


class ConvBn(nn.Module):
    def __init__(self, conv: nn.Module, channels: int, eps: float = 1e-5,
                 momentum: float | None = 0.1) -> None:
        super().__init__()
        self.conv = conv
        self.bn = nn.BatchNorm2d(channels, eps=eps, momentum=momentum)
        torch.manual_seed(3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            # a small variance: where eps shows
            self.bn.running_var.uniform_(1e-3, 4e-3)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def _inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return (torch.randn(2, 4, 6, 6) * 0.05,)


def _prepared(model: nn.Module, installed: bool) -> torch.fx.GraphModule:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=True))
    gm = torch.export.export(copy.deepcopy(model).train(), _inputs()).module(check_guards=False)
    if installed:
        with xnnpack_adapter.install():
            return prepare_qat_pt2e(gm, quantizer)  # type: ignore[arg-type]
    return prepare_qat_pt2e(gm, quantizer)  # type: ignore[arg-type]


def _train_error(model: nn.Module, prepared: torch.fx.GraphModule) -> float:
    eager = copy.deepcopy(model).train()
    with torch.no_grad():
        return float((prepared(*_inputs()) - eager(*_inputs())).abs().max())


def test_the_rules_replacement_trains_as_the_convolution_and_batch_norm() -> None:
    """The rule's replacement (torchao's subgraph, inlined) computes conv + batch norm in
    training mode; the eager model and the rewritten graph agree on a training step."""
    model = ConvBn(nn.Conv2d(4, 3, 3, padding=1, stride=2), 3).train()
    gm = torch.export.export(copy.deepcopy(model), _inputs()).module(check_guards=False)
    lifted = lift(gm)
    run = run_rules(lifted.ep, rules(), check_replacements=False)
    assert len(run.applied) == 1, run.matches.declined
    targets = {str(n.target) for n in lifted.ep.graph.nodes if n.op == "call_function"}
    assert {"aten.sqrt.default", "aten.mul.Tensor", "aten.conv2d.default"} <= targets
    conv = next(n for n in lifted.ep.graph.nodes if str(n.target) == "aten.conv2d.default")
    assert tuple(conv.args[3:5]) == ([2, 2], [1, 1])  # the user's stride and padding kept
    from fusionkit.integration.graph_module_program import write_back

    write_back(lifted)
    with torch.no_grad():
        want = copy.deepcopy(model).train()(*_inputs())
        got = gm(*_inputs())
    assert float((got - want).abs().max()) < 1e-5 * float(want.abs().max())


def test_another_eps_is_declined_where_torchaos_rewrite_computes_another_model() -> None:
    model = ConvBn(nn.Conv2d(4, 3, 3), 3, eps=1e-3)
    stock = _prepared(model, installed=False)
    ours = _prepared(model, installed=True)
    report = ours.meta[quantize_step_qat.META_KEY]
    assert not report.folded
    [decline] = report.declined
    assert decline.step == "custom:literals_as_rewritten" and "eps=0.001" in decline.reason
    # in training mode the batch's own variance normalizes: eps 1e-5 for 1e-3 shows where
    # the batch variance is small (inputs scaled by 0.05)
    tolerance = 4 * 3.0 / 127
    ours_off, stock_off = _train_error(model, ours), _train_error(model, stock)
    assert ours_off <= tolerance < stock_off, (ours_off, stock_off)


def test_another_momentum_is_declined() -> None:
    model = ConvBn(nn.Conv2d(4, 3, 3), 3, momentum=0.01)
    ours = _prepared(model, installed=True)
    [decline] = ours.meta[quantize_step_qat.META_KEY].declined
    assert decline.step == "custom:literals_as_rewritten" and "momentum=0.01" in decline.reason
    stock = _prepared(model, installed=False)
    bns = [n for n in stock.graph.nodes if str(n.target) == "aten.batch_norm.default"]
    assert [n.args[6] for n in bns] == [0.1]  # stock trains its statistics 10x faster


def test_a_grouped_transposed_convolution_is_declined_and_trains() -> None:
    model = ConvBn(nn.ConvTranspose2d(4, 4, 3, groups=2), 4)
    ours = _prepared(model, installed=True)
    [decline] = ours.meta[quantize_step_qat.META_KEY].declined
    assert decline.step == "custom:one_group_if_transposed", decline
    assert _train_error(model, ours) <= 4 * 3.0 / 127
    stock = _prepared(model, installed=False)
    with pytest.raises(RuntimeError, match="size of tensor"):
        stock(*_inputs())


def test_a_stock_quantizer_without_install_gets_torchaos_rewrite() -> None:
    """Not installed and no fusionkit quantizer: the call site runs torchao's code, which
    rewrites the eps pair fusionkit declines (no report is written)."""
    assert not quantize_step.is_installed()
    model = ConvBn(nn.Conv2d(4, 3, 3), 3, eps=1e-3)
    stock = _prepared(model, installed=False)
    assert quantize_step_qat.META_KEY not in stock.meta
    assert any(str(n.target) == "aten.sqrt.default" for n in stock.graph.nodes)



def test_fusionkit_arm_quantizer_decides_qat_with_the_rules() -> None:
    """fusionkit's TOSAQuantizer, nothing installed: ``prepare_qat_pt2e`` names it to the
    call site, the graph-input batch-norm weight is declined, and ``convert_pt2e`` (which
    crashes on stock's rewrite of it) converts; stock's TOSAQuantizer rewrites it."""
    from executorch.backends.arm.quantizer import TOSAQuantizer as StockTOSAQuantizer
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    from fusionkit.backends.arm_adapter.quantizer import TOSAQuantizer

    class GivenWeight(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(4, 3, 3), nn.BatchNorm2d(3)

        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            bn = self.bn
            return F.batch_norm(self.conv(x), bn.running_mean, bn.running_var, w, bn.bias,
                                True, 0.1, 1e-5)

    inputs = (*_inputs(), torch.rand(3) + 0.5)
    assert not quantize_step.is_installed()
    prepared = {}
    for name, make in (("ours", TOSAQuantizer), ("stock", StockTOSAQuantizer)):
        q = make(TosaCompileSpec("TOSA-1.0+INT"))
        q.set_global(get_symmetric_quantization_config(is_qat=True))
        gm = torch.export.export(GivenWeight().train(), inputs).module(check_guards=False)
        prepared[name] = prepare_qat_pt2e(gm, q)
    [decline] = prepared["ours"].meta[quantize_step_qat.META_KEY].declined
    assert decline.step == "custom:operands_constant" and "user input" in decline.reason
    convert_pt2e(prepared["ours"])
    assert quantize_step_qat.META_KEY not in prepared["stock"].meta
    with pytest.raises(ValueError, match="Expected get_attr node, got"):
        convert_pt2e(prepared["stock"])
