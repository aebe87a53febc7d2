"""Inside Vulkan preprocess, fusionkit rules run in place of stock rewrite passes (issue 25).

``AddmmToLinearTransform`` (both runs), ``FuseBatchNormPass``, ``FuseClampPass``,
``RemoveRedundantOpsTransform``, ``FuseViewCopyTransform`` and
``ViewCopyToSqueezeUnsqueezePass`` of ExecuTorch 1.5.1's ``VulkanBackend.preprocess``
are replaced by the rules of ``passes/vulkan/{addmm_to_linear,batch_norm,conv_clamp,
redundant_ops,fuse_view_copy,view_to_squeeze}.py`` (:mod:`fusionkit.backends.vulkan_adapter.preprocess_rules`).
A held-out model (convolutions with batch norms, relu / hardtanh / relu6 after
convolutions, a conv1d with a batch norm, a linear with a batch norm, a plain linear
(addmm), view chains, a clone and a no-op expand, a clamp) is lowered through the adapter twice: with the rules and
with the stock passes (:func:`preprocess_rules.disabled`). The ``.pte`` files must be
byte-identical, the stock passes must not have run with the rules on, and the program
must run like eager on the simulator and on the real Vulkan runtime (lavapipe, in a
child process) where it is installed. Gating runs under ``pass_gating.checking()``: a
pass skipped after a rule rewrote the graph in place would have to change nothing.

Where the rules differ from stock on purpose, a test shows stock's fault: two
convolutions sharing one weight, each with its own batch norm (stock gives both the
first one's folded weight), and a batch norm whose running mean is a user input (stock
raises inside preprocess; the rule declines and says why).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge, to_edge_transform_and_lower
from torch import nn

import fusionkit.backends.vulkan_adapter as vk
from fusionkit.backends.vulkan_adapter import preprocess_rules as pr
from fusionkit.backends.vulkan_adapter import runtime
from fusionkit.integration import pass_gating

REPLACED = ("AddmmToLinearTransform", "FuseBatchNormPass", "FuseClampPass",
            "RemoveRedundantOpsTransform", "FuseViewCopyTransform",
            "ViewCopyToSqueezeUnsqueezePass")


def _randomize(*bns: nn.Module) -> None:
    with torch.no_grad():
        for bn in bns:
            bn.running_mean.uniform_(-0.5, 0.5)  # type: ignore[operator]
            bn.running_var.uniform_(0.5, 1.5)  # type: ignore[operator]
            bn.weight.uniform_(0.5, 1.5)  # type: ignore[operator]
            bn.bias.uniform_(-0.5, 0.5)  # type: ignore[operator]


class HeldOut(nn.Module):
    """What the replaced passes act on, and what they must leave alone."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c3 = nn.Conv2d(8, 8, 1)
        self.c4 = nn.Conv2d(8, 8, 1)  # two users: no clamp fusion
        self.c5, self.bn5 = nn.Conv1d(8, 4, 3, padding=1), nn.BatchNorm1d(4)
        self.lin, self.bnl = nn.Linear(16, 16), nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 8)
        _randomize(self.bn1, self.bn2, self.bn5, self.bnl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.c1(x)))
        y = F.hardtanh(self.bn2(self.c2(y)), -0.5, 0.5)
        y = F.relu6(self.c3(y))
        u = self.c4(y)
        y = torch.relu(u) + u
        z = self.bn5(self.c5(y.flatten(2)))  # (1, 4, 16)
        w = self.bnl(self.lin(z.reshape(4, 16)))
        v = self.head(w).reshape(2, 2, 8).reshape(4, 8)  # a view chain
        v = v.clone().expand(4, 8)  # copies that change nothing
        return torch.clamp(v, -1.0, 1.0)


class SharedWeight(nn.Module):
    """One convolution applied twice, each time with its own batch norm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.bn_a, self.bn_b = nn.BatchNorm2d(4), nn.BatchNorm2d(4)
        _randomize(self.bn_a, self.bn_b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn_a(self.conv(x)) + self.bn_b(self.conv(x * 2.0))


@dataclass
class Lowered:
    pte: bytes
    program: Any
    rule_counts: dict[str, dict[str, int]]
    pass_counts: dict[str, dict[str, int]]


def lower(model: nn.Module, inputs: tuple[torch.Tensor, ...], rules: bool,
          runtime: Any = "auto") -> Lowered:
    """``runtime``: the partitioner's (None: trust the 1.5.1 registry, so that a program
    the probed runtime cannot run is still made, to test what runs it)."""
    ep = torch.export.export(model, inputs)
    pr.reset_counts()
    pass_gating.reset_counts()
    with pass_gating.checking(), (pr.disabled() if not rules else contextlib.nullcontext()):
        prog = to_edge_transform_and_lower(copy.deepcopy(ep), transform_passes=vk.transform_passes(),
                                           partitioner=[vk.VulkanPartitioner(runtime=runtime)])
        pte = bytes(prog.to_executorch().buffer)
    return Lowered(pte, prog, pr.counts(), pass_gating.counts())


def _eager(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        return model(*inputs)  # type: ignore[no-any-return]


def _simulated(low: Lowered, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    got = vk.simulate(low.program, *inputs)
    return got[0] if isinstance(got, (tuple, list)) else got  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def held_out() -> tuple[nn.Module, tuple[torch.Tensor, ...], Lowered, Lowered]:
    torch.manual_seed(0)
    model = HeldOut().eval()
    inputs = (torch.randn(1, 3, 4, 4),)
    return model, inputs, lower(model, inputs, True), lower(model, inputs, False)


def test_the_rules_run_instead_of_the_stock_passes(held_out: Any) -> None:
    _, _, rules, stock = held_out
    # conv+bn x2, conv1d+bn, linear+bn; relu, hardtanh and relu6 after single-user convs
    assert rules.rule_counts["FuseBatchNormPass"]["fused"] == 4
    assert rules.rule_counts["FuseClampPass"]["fused"] == 3
    assert rules.rule_counts["AddmmToLinearTransform"]["fused"] == 2  # the two addmm
    assert rules.rule_counts["RemoveRedundantOpsTransform"]["fused"] == 2  # clone, expand
    assert rules.rule_counts["ViewCopyToSqueezeUnsqueezePass"]["fused"] == 1  # (1,4,16)->(4,16)
    assert rules.rule_counts["FuseViewCopyTransform"]["fused"] == 1  # reshape(2,2,8).reshape(4,8)
    for name in REPLACED:
        assert name not in rules.pass_counts, f"{name} ran although its rules replace it"
        assert stock.pass_counts[name]["ran"] >= 1
    assert stock.rule_counts == {}


def test_the_payload_is_byte_identical_to_the_stock_passes(held_out: Any) -> None:
    _, _, rules, stock = held_out
    assert rules.pte == stock.pte


def test_simulates_like_eager(held_out: Any) -> None:
    model, inputs, rules, _ = held_out
    assert float((_simulated(rules, inputs) - _eager(model, inputs)).abs().max()) <= 1e-4


@pytest.mark.skipif(runtime.find_runtime() is None,
                    reason="the real Vulkan runtime is not installed (bash scripts/vulkan-runtime)")
def test_runs_like_eager_on_the_real_runtime(held_out: Any) -> None:
    model, inputs, rules, _ = held_out
    result = runtime.run_in_child(rules.pte, list(inputs))
    assert result.ok, result.message
    assert result.outputs is not None
    assert float((result.outputs[0] - _eager(model, inputs)).abs().max()) <= 1e-3


def test_a_shared_weight_gets_one_folded_copy_per_batch_norm() -> None:
    """Stock names the folded weight after the source weight, so the second batch norm
    reuses the first one's: its payload computes something else. The rule's does not."""
    torch.manual_seed(1)
    model = SharedWeight().eval()
    inputs = (torch.randn(1, 4, 4, 4),)
    want = _eager(model, inputs)
    rules, stock = lower(model, inputs, True), lower(model, inputs, False)
    assert rules.rule_counts["FuseBatchNormPass"]["fused"] == 2
    assert float((_simulated(rules, inputs) - want).abs().max()) <= 1e-4
    assert float((_simulated(stock, inputs) - want).abs().max()) > 1e-2, "stock's bug is gone?"
    assert rules.pte != stock.pte


class UserStatistics(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.w, self.b = nn.Parameter(torch.ones(4)), nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(self.conv(x), mean, var, self.w, self.b, training=False)


def test_a_batch_norm_with_statistics_from_the_user_is_declined_where_stock_raises() -> None:
    from executorch.backends.xnnpack._passes import FuseBatchNormPass

    inputs = (torch.randn(1, 3, 4, 4), torch.randn(4), torch.rand(4) + 0.5)
    ep = to_edge(torch.export.export(UserStatistics().eval(), inputs)).exported_program()
    twin = copy.deepcopy(ep)
    with pytest.raises(RuntimeError, match="unsupported param type"):
        FuseBatchNormPass(twin)(twin.graph_module)
    before = str(ep.graph_module.graph)
    pr.reset_counts()
    pr.RulePass("FuseBatchNormPass")(ep)
    assert str(ep.graph_module.graph) == before
    assert pr.counts()["FuseBatchNormPass"] == {"runs": 1, "fused": 0, "declined": 1,
                                                  "stock_runs": 0}
    from fusionkit import find_matches

    (decline,) = find_matches(ep, list(pr.rules_for("FuseBatchNormPass")),
                              structural_declines=False).declined
    assert "mean" in decline.reason and "not a constant" in decline.reason


class IdentityPermute(nn.Module):
    """``x @ w.permute(0, 1)``: an mm whose weight is a permute_copy that transposes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w.permute(0, 1)


def test_an_mm_of_a_permute_that_transposes_nothing_stays_an_mm() -> None:
    """Stock turns ``mm(x, permute_copy(w, [0, 1]))`` into ``linear(x, w)`` = ``x @ w.T``."""
    from executorch.backends.transforms.addmm_mm_to_linear import AddmmToLinearTransform

    torch.manual_seed(2)
    model, inputs = IdentityPermute().eval(), (torch.randn(3, 8),)
    want = _eager(model, inputs)
    ep = to_edge(torch.export.export(model, inputs)).exported_program()
    twin = copy.deepcopy(ep)
    AddmmToLinearTransform()(twin.graph_module)
    with torch.no_grad():
        wrong = twin.module()(*inputs)
    assert float((wrong - want).abs().max()) > 1e-2, "stock's bug is gone?"
    pr.reset_counts()
    pr.RulePass("AddmmToLinearTransform")(ep)
    assert pr.counts()["AddmmToLinearTransform"]["fused"] == 0
    with torch.no_grad():
        assert float((ep.module()(*inputs) - want).abs().max()) <= 1e-5
    rules, stock = lower(model, inputs, True), lower(model, inputs, False)
    assert float((_simulated(rules, inputs) - want).abs().max()) <= 1e-4
    assert float((_simulated(stock, inputs) - want).abs().max()) > 1e-2


class ViewChains(nn.Module):
    """Views that add / drop size-1 dims, and views around unary ops."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.lin(x).reshape(2, 1, 8)  # adds dim 1
        b = (a * 2.0).reshape(2, 8)  # drops dim 1
        c = torch.relu(b.reshape(1, 2, 8)).reshape(2, 4, 2)  # view, unary, view
        d = torch.sigmoid(torch.abs(c + 1.0).reshape(16)).reshape(2, 8, 1)
        return d.reshape(2, 8) - 1.0


def test_view_chains_give_the_stock_bytes_and_eager_values() -> None:
    torch.manual_seed(3)
    model, inputs = ViewChains().eval(), (torch.randn(2, 8),)
    rules, stock = lower(model, inputs, True), lower(model, inputs, False)
    assert rules.rule_counts["FuseViewCopyTransform"]["fused"] >= 2
    assert rules.rule_counts["ViewCopyToSqueezeUnsqueezePass"]["fused"] >= 1
    assert rules.pte == stock.pte
    assert float((_simulated(rules, inputs) - _eager(model, inputs)).abs().max()) <= 1e-5


class LinearBatchNormOutput(nn.Module):
    """A batch norm whose output is the program's output (ExecuTorch's
    test_vulkan_backend_batch_norm_after_linear): the output spec must follow the fold."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.bn = nn.Linear(8, 8), nn.BatchNorm1d(8)
        _randomize(self.bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))  # type: ignore[no-any-return]


def test_a_folded_batch_norm_that_is_the_output() -> None:
    torch.manual_seed(4)
    model, inputs = LinearBatchNormOutput().eval(), (torch.randn(4, 8),)
    rules, stock = lower(model, inputs, True), lower(model, inputs, False)
    assert rules.rule_counts["FuseBatchNormPass"]["fused"] == 1
    assert rules.pte == stock.pte
    assert float((_simulated(rules, inputs) - _eager(model, inputs)).abs().max()) <= 1e-5
