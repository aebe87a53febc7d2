"""The Arm adapter: the TOSA pipeline's fusions as fusionkit rules, judged on the TOSA
reference model (``tosa-tools``) against eager PyTorch (float) or the fake-quantized model
(integer), and against stock ExecuTorch's TOSA flatbuffer byte for byte."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

pytest.importorskip("tosa_reference_model")
pytest.importorskip("executorch.backends.arm.tosa.partitioner")

from fusionkit.backends import arm_adapter
from fusionkit.backends.arm_adapter import preprocess_rules
from fusionkit.backends.arm_adapter import reference_model as rm

pytestmark = pytest.mark.slow

#: float: the reference model's float32 against eager; integer: the same int8 program
FP_TOL = 1e-5
INT_TOL = 1e-6


class Chains(torch.nn.Module):
    """Every activation chain the pipeline turns into consecutive clamps, both activations
    the quantized-activation fusion takes (relu after a conv, hardtanh(0, max) after a
    linear) and a slice of a slice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.conv2 = torch.nn.Conv2d(4, 4, 1)
        self.linear = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        y = torch.relu(torch.nn.functional.hardtanh(self.conv2(y), -1.0, 2.0))
        z = torch.nn.functional.hardtanh(self.linear(y), 0.0, 1.0)
        z = z[:, 1:4][:, :, 1:5]  # two slices: one tosa.SLICE after FuseConsecutiveSlicesPass
        return torch.clamp(torch.clamp(z, min=0.1), max=0.8)


def _case() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Chains().eval(), (torch.randn(1, 3, 8, 8),)


def _both_ways(spec: str) -> dict[str, Any]:
    model, inputs = _case()
    out: dict[str, Any] = {}
    for way in ("stock", "fusionkit"):
        preprocess_rules.reset_counts()
        out[way] = rm.evaluate(model, inputs, fusionkit=way == "fusionkit", spec=spec)
        out[f"{way}_counts"] = preprocess_rules.counts()
    return out


@pytest.fixture(scope="module")
def fp() -> dict[str, Any]:
    return _both_ways(rm.FP)


@pytest.fixture(scope="module")
def int8() -> dict[str, Any]:
    return _both_ways(rm.INT)


def test_float_rules_fuse_and_the_tosa_is_stocks(fp: dict[str, Any]) -> None:
    stock, ours = fp["stock"], fp["fusionkit"]
    assert ours.delegated >= 1
    # the stock lowering ran no rule; ours ran the clamp rule in the stock pass's place
    assert fp["stock_counts"] == {}
    assert fp["fusionkit_counts"]["FuseConsecutiveClampsPass"]["fused"] >= 2
    assert fp["fusionkit_counts"]["FuseConsecutiveSlicesPass"]["fused"] >= 1
    assert ours.tosa == stock.tosa
    assert ours.error <= FP_TOL and stock.error <= FP_TOL


def test_integer_rules_fuse_and_the_tosa_is_stocks(int8: dict[str, Any]) -> None:
    stock, ours = int8["stock"], int8["fusionkit"]
    counts = int8["fusionkit_counts"]
    assert counts["FuseQuantizedActivationPass"]["fused"] >= 2  # conv+relu, linear+hardtanh
    assert counts["FuseConsecutiveSlicesPass"]["fused"] >= 1
    assert counts["FuseConsecutiveRescalesPass"]["runs"] >= 1
    assert ours.tosa == stock.tosa
    # judged against the fake-quantized model (the same int8 arithmetic)
    assert ours.error <= INT_TOL, ours.error
    # and the fake-quantized model is a real quantization of eager, not eager itself
    assert 0 < rm.max_error(ours.reference, ours.eager) < 0.1


class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_the_safe_softmax_guard_goes_under_the_remove_policy_only() -> None:
    from executorch.backends.arm.common.pipeline_config import (
        ArmPassPipelineConfig,
        SDPASafeSoftmaxGuardPolicy,
    )
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner as Stock

    torch.manual_seed(0)
    model, inputs = Attention(), tuple(torch.randn(1, 2, 4, 8) for _ in range(3))
    want = [model(*inputs)]

    def spec(policy: Any) -> Any:
        s = TosaCompileSpec(rm.FP)
        s.set_pass_pipeline_config(ArmPassPipelineConfig(sdpa_safe_softmax_guard=policy))
        return s

    tosa, fused = {}, {}
    remove, preserve = SDPASafeSoftmaxGuardPolicy.REMOVE, SDPASafeSoftmaxGuardPolicy.PRESERVE
    ours = arm_adapter.TOSAPartitioner
    for policy, way, cls in ((remove, "stock", Stock), (remove, "fusionkit", ours),
                             (preserve, "fusionkit", ours)):
        preprocess_rules.reset_counts()
        edge = rm.lower(model, inputs, fusionkit=False,
                        partitioner=lambda _s, cls=cls, policy=policy: cls(spec(policy)))
        assert rm.max_error(rm.run_on_reference_model(edge, inputs), want) <= FP_TOL
        tosa[policy, way] = rm.tosa_flatbuffers(edge)
        fused[policy, way] = preprocess_rules.counts().get(
            "RemoveSafeSoftmaxGuardPass", {}).get("fused", 0)
    assert tosa[remove, "fusionkit"] == tosa[remove, "stock"]
    assert fused[remove, "fusionkit"] == 1
    # PRESERVE: Arm's config skips the pass, so there is no pass to take over: the guard
    # is lowered (another program)
    assert fused[preserve, "fusionkit"] == 0
    assert tosa[preserve, "fusionkit"] != tosa[remove, "stock"]


def test_a_stock_lowering_beside_the_adapter_is_untouched(fp: dict[str, Any]) -> None:
    # after the adapter's lowerings (the fixture), a stock lowering in the same process
    # runs no rule and gives the stock bytes again
    model, inputs = _case()
    preprocess_rules.reset_counts()
    again = rm.evaluate(model, inputs, fusionkit=False, spec=rm.FP)
    assert preprocess_rules.counts() == {}
    assert again.tosa == fp["stock"].tosa
    scope = arm_adapter.partitioner.PREPROCESS_SCOPE
    assert scope.pending == 0 and not scope.is_dispatching()
    assert not arm_adapter.is_installed()


def test_install_puts_the_rules_under_stock_partitioners(fp: dict[str, Any]) -> None:
    model, inputs = _case()
    preprocess_rules.reset_counts()
    with arm_adapter.install():
        assert arm_adapter.is_installed()
        run = rm.evaluate(model, inputs, fusionkit=False, spec=rm.FP)
    assert not arm_adapter.is_installed()
    assert preprocess_rules.counts()["FuseConsecutiveClampsPass"]["fused"] >= 2
    assert run.tosa == fp["stock"].tosa
    # disabled(): the stock passes, installed or not
    preprocess_rules.reset_counts()
    with arm_adapter.install(), preprocess_rules.disabled():
        rm.evaluate(model, inputs, fusionkit=False, spec=rm.FP)
    assert preprocess_rules.counts() == {}


def test_the_partitioners_take_what_arms_take() -> None:
    from executorch.backends.arm.ethosu import EthosUCompileSpec
    from executorch.backends.arm.ethosu import EthosUPartitioner as StockEthosU
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner as StockTOSA
    from executorch.backends.arm.vgf import VgfCompileSpec
    from executorch.backends.arm.vgf import VgfPartitioner as StockVgf

    from fusionkit.integration.scoped import MARKER_KEY

    for ours, stock in ((arm_adapter.TOSAPartitioner, StockTOSA),
                        (arm_adapter.EthosUPartitioner, StockEthosU),
                        (arm_adapter.VgfPartitioner, StockVgf)):
        assert issubclass(ours, stock)
        assert inspect.signature(ours.__init__) == inspect.signature(stock.__init__)
    specs = {arm_adapter.TOSAPartitioner: TosaCompileSpec(rm.INT),
             arm_adapter.EthosUPartitioner: EthosUCompileSpec("ethos-u55-128"),
             arm_adapter.VgfPartitioner: VgfCompileSpec()}
    markers = set()
    for cls, spec in specs.items():
        part = cls(spec)
        keys = [s.key for s in part.delegation_spec.compile_specs]
        assert keys.count(MARKER_KEY) == 1
        markers |= {s.value for s in part.delegation_spec.compile_specs if s.key == MARKER_KEY}
        # the marker is a compile spec Arm's parser ignores
        type(spec)._from_list(part.delegation_spec.compile_specs)
    assert len(markers) == 3  # one per backend whose preprocess is scoped


def test_every_taken_over_pass_is_one_arm_runs() -> None:
    import executorch.backends.arm._passes as arm_passes

    from fusionkit.passes.arm import rules_for, taken_over_passes

    taken = taken_over_passes()
    assert {"FuseQuantizedActivationPass", "FuseConsecutiveClampsPass",
            "FuseConsecutiveRescalesPass", "FuseConsecutiveSlicesPass",
            "RemoveSafeSoftmaxGuardPass"} <= set(taken)
    for name in taken:
        assert isinstance(getattr(arm_passes, name), type)
        assert rules_for(name), name
