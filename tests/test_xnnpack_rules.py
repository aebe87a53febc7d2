"""XNNPACK preprocess rewrites as fusionkit rules: the adapter's delegate vs stock ExecuTorch's.

Each model is lowered twice, once each (module-scoped): through fusionkit's
``XnnpackPartitioner`` (its partitions are preprocessed with
:mod:`fusionkit.backends.xnnpack_adapter.preprocess_rules` in place of the stock
pattern passes) and through ExecuTorch 1.5.1's own partitioner (fusionkit
uninstalled). The delegate payloads must be byte-identical -- except where a test
below shows a stock bug the rules fix -- and both ``.pte`` run (portable_lib) equal
to eager PyTorch. The mixed model is written for this file (not one of ExecuTorch's op
tests, not the issue's model): conv + batch norm + relu, ReLU6 (hardtanh) after a conv, a residual
add + relu, mul + hardtanh, a 7-way concatenation, 1-D convolutions, a bilinear
upsample, PReLU and linear + relu.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as StockXnnpackPartitioner,
)
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

import fusionkit.backends.xnnpack_adapter as xa
from fusionkit.backends.xnnpack_adapter import XnnpackPartitioner
from fusionkit.backends.xnnpack_adapter import preprocess_rules as pr
from fusionkit.integration.spilled_data import blob_bytes
from fusionkit.passes.registry import registered

pytestmark = pytest.mark.slow

TOL = 1e-4


@dataclass
class Lowered:
    out: torch.Tensor | None = None
    payloads: list[bytes] = field(default_factory=list)
    named: list[dict[str, bytes]] = field(default_factory=list)
    error: str | None = None
    rule_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    stock_calls: dict[str, int] = field(default_factory=dict)

    def err(self, ref: torch.Tensor) -> float:
        assert self.out is not None, self.error
        return float((self.out - ref).abs().max())


def _counting_stock_passes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count calls of every stock pass the rules take over (the takeover must make none)."""
    import importlib

    module = importlib.import_module("executorch.backends.xnnpack._passes")
    calls: dict[str, int] = {}
    for name in pr.TAKEN_OVER_PASSES:
        cls = getattr(module, name)
        original = cls.call

        def call(self: Any, gm: Any, _orig: Callable[..., Any] = original,
                 _name: str = name) -> Any:
            calls[_name] = calls.get(_name, 0) + 1
            return _orig(self, gm)

        monkeypatch.setattr(cls, "call", call)
    return calls


def lower(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], mode: str) -> Lowered:
    """``mode``: "rules" (fusionkit's partitioner) or "stock" (ExecuTorch's, uninstalled)."""
    result = Lowered()
    with pytest.MonkeyPatch.context() as mp:
        result.stock_calls = _counting_stock_passes(mp)
        pr.reset_counts()
        xa.uninstall()
        part: Any = XnnpackPartitioner() if mode == "rules" else StockXnnpackPartitioner()
        ep = torch.export.export(model, inputs)
        try:
            epm = to_edge_transform_and_lower(ep, partitioner=[part])
        except Exception as e:  # a stock failure is a finding; ours would fail the test
            result.error = f"{type(e).__name__}: {e}"
            from fusionkit.backends.xnnpack_adapter.partitioner import PREPROCESS_SCOPE

            PREPROCESS_SCOPE.reset()
            return result
        result.rule_counts = pr.counts()
    for _, lbm, _ in get_lowered_submodules(epm.exported_program().graph_module):
        result.payloads.append(bytes(lbm.processed_bytes))
        nds = lbm.named_data_store_output
        result.named.append({k: blob_bytes(nds.buffers[e.buffer_index])
                             for k, e in nds.pte_data.items()})
    et = epm.to_executorch()
    result.out = _load_for_executorch_from_buffer(et.buffer).forward(inputs)[0]
    return result


# ----------------------------------------------------------------------------- models


class MixedNet(torch.nn.Module):
    """A small vision-and-sequence block mixing the patterns the XNNPACK passes rewrite."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        with torch.no_grad():  # statistics a trained model would have
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5)
        self.branch = torch.nn.Conv2d(8, 8, 1)
        self.prelu = torch.nn.PReLU(8)
        self.seq = torch.nn.Conv1d(8, 6, 3, padding=1)
        self.seq2 = torch.nn.Conv1d(6, 6, 1, groups=2, bias=False)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.bn(self.stem(x)))              # conv + batch norm + relu
        b = F.relu6(self.branch(a))                        # conv + hardtanh(0, 6)
        c = torch.relu(a + b)                              # add + relu
        d = F.hardtanh(c * 0.5, -0.5, 0.5)                 # mul + hardtanh
        e = self.prelu(d)
        cat = torch.cat([a, b, c, d, e, a - e, b * c], 1)  # 7 inputs: > 5
        up = F.interpolate(cat, scale_factor=2, mode="bilinear", align_corners=False)
        s = up.mean(dim=(1,)).reshape(1, 8, 32)[:, :, :16]  # [1, 8, 16]
        t = torch.relu(self.seq2(torch.relu(self.seq(s))))  # conv1d + relu, twice
        return torch.relu(self.head(t))                   # linear + relu


class ReluThenHardtanh(torch.nn.Module):
    """conv -> relu -> hardtanh(-1, 1): clamp(conv, 0, 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(torch.relu(self.conv(x)), -1.0, 1.0)


class SharedConv1d(torch.nn.Module):
    """One Conv1d applied twice: two convolutions reading the same weight."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.relu(self.conv(x)))


class QuantizedMixedNet(torch.nn.Module):
    """Quantized (pt2e, XNNPACKQuantizer) convs: conv2d + relu, a zero pad, a 1-D
    convolution + relu on the flattened rows, and a 6-way concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3)
        self.seq = torch.nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.conv(x))                        # [1, 8, 8, 8]
        b = self.conv2(F.pad(a, (1, 1, 1, 1)))              # zero pad, then conv
        s = torch.relu(self.seq(b.reshape(1, 8, 64)))       # conv1d + relu
        t = s.reshape(1, 8, 8, 8)
        return torch.cat([a, b, t, a, b, t], 1)             # 6 inputs


def _trained(*bns: torch.nn.Module) -> None:
    """Statistics a trained model would have (not the identity)."""
    with torch.no_grad():
        for bn in bns:
            bn.running_mean.uniform_(-1.0, 1.0)
            bn.running_var.uniform_(0.2, 2.0)
            if bn.weight is not None:
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)


class LoneBatchNorms(torch.nn.Module):
    """Batch norms no conv or linear absorbs (DecomposeBatchNorm): NCHW after a residual
    add, NCL after a conv1d + relu, NC after a linear + relu."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.bn2d = torch.nn.BatchNorm2d(4)
        self.seq = torch.nn.Conv1d(4, 4, 3, padding=1)
        self.bn_ncl = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(64, 8)
        self.bn_nc = torch.nn.BatchNorm1d(8)
        _trained(self.bn2d, self.bn_ncl, self.bn_nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.bn2d(self.conv(x) + x)                        # [1, 4, 4, 4]
        s = self.bn_ncl(torch.relu(self.seq(a.flatten(2))))    # [1, 4, 16]
        return self.bn_nc(torch.relu(self.head(s.flatten(1))))  # [1, 8]


class TwoNonAffineBatchNorms(torch.nn.Module):
    """Two ``BatchNorm2d(affine=False)`` with their own statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.BatchNorm2d(8, affine=False)
        self.second = torch.nn.BatchNorm2d(8, affine=False)
        _trained(self.first, self.second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x + 1.0)) * 2.0)


class ChainedBatchNorms(torch.nn.Module):
    """A batch norm straight after another (neither after a conv)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.BatchNorm2d(8)
        self.second = torch.nn.BatchNorm2d(8)
        _trained(self.first, self.second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x + 1.0))


class Clones(torch.nn.Module):
    """Identity clones mid-graph (XNNPACKRemoveCloneOpsTransform), and one copying the
    graph input straight to an output (kept: the delegate must write that output)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.clone(self.conv(x))
        b = a.clone(memory_format=torch.contiguous_format) + 1.0
        return torch.relu(b).clone(), x.clone()


class QuantizedClone(torch.nn.Module):
    """conv + relu -> clone -> conv, quantized: the clone sits between a dequantize and a
    quantize with the same parameters, a pair that goes with it."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.clone(torch.relu(self.c1(x))))


class MaxValues(torch.nn.Module):
    """``max.dim`` read for its values only (RemoveGetItemPass: -> amax), twice, and once
    for values and indices (left to XNNPACK's max.dim visitor)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.max(x, dim=2, keepdim=True)[0]
        b = torch.max(torch.relu(x) * a, dim=3, keepdim=True)[0]
        v, i = torch.max(x + b, dim=2, keepdim=True)
        return v * 2.0, i


def _quantized(model: torch.nn.Module, shape: tuple[int, ...]) -> torch.nn.Module:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(model.eval(), (torch.randn(*shape),)).module(),
                            quantizer)
    for _ in range(4):
        prepared(torch.randn(*shape))
    return convert_pt2e(prepared)  # type: ignore[no-any-return]


CASES: dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...]]] = {
    "mixed": (MixedNet, (1, 3, 8, 8)),
    "relu_then_hardtanh": (ReluThenHardtanh, (1, 3, 8, 8)),
    "shared_conv1d": (SharedConv1d, (1, 4, 16)),
    "quantized": (lambda: _quantized(QuantizedMixedNet(), (1, 4, 8, 8)), (1, 4, 8, 8)),
    "lone_batch_norms": (LoneBatchNorms, (1, 4, 4, 4)),
    "two_non_affine_batch_norms": (TwoNonAffineBatchNorms, (1, 8, 4, 4)),
    "chained_batch_norms": (ChainedBatchNorms, (1, 8, 4, 4)),
    "clones": (Clones, (1, 3, 8, 8)),
    "quantized_clone": (lambda: _quantized(QuantizedClone(), (1, 4, 8, 8)), (1, 4, 8, 8)),
    "max_values": (MaxValues, (1, 3, 4, 5)),
}
#: int8 requantization: a value may land one output step away
QUANT_TOL = 0.1


@pytest.fixture(scope="module")
def lowered() -> dict[str, tuple[torch.Tensor, Lowered, Lowered]]:
    out = {}
    for name, (make, shape) in CASES.items():
        torch.manual_seed(0)
        model = make()
        if not isinstance(model, torch.fx.GraphModule):  # (a converted pt2e model has no eval)
            model = model.eval()
        inputs = (torch.randn(*shape),)
        with torch.no_grad():
            ref = model(*inputs)
        ref = ref[0] if isinstance(ref, tuple) else ref  # (what lower() runs: output 0)
        out[name] = (ref, lower(model, inputs, "rules"), lower(model, inputs, "stock"))
    return out


# ----------------------------------------------------------------------------- tests


def test_every_taken_over_pass_is_a_stock_pass_of_the_default_list() -> None:
    import importlib

    module = importlib.import_module("executorch.backends.xnnpack._passes")
    stock = module.XNNPACKPassManager(None).passes  # the default list
    names = {p.__name__ for p in stock}
    assert set(pr.TAKEN_OVER_PASSES) <= names
    # layout and generic passes stay ExecuTorch's
    assert not {"ChannelsLastTaggedReshapePass", "ConstPropPass"} & set(pr.TAKEN_OVER_PASSES)
    # every factory of the set says which pass it takes over
    assert all(f.takes_over for f in registered("xnnpack"))


def test_mixed_model_delegate_is_byte_identical_to_stock(lowered: Any) -> None:
    ref, ours, stock = lowered["mixed"]
    assert ours.error is None and stock.error is None, (ours.error, stock.error)
    assert ours.payloads and ours.payloads == stock.payloads
    assert ours.named == stock.named
    assert ours.err(ref) < TOL and stock.err(ref) < TOL


def test_mixed_model_rules_ran_in_place_of_the_stock_passes(lowered: Any) -> None:
    _, ours, stock = lowered["mixed"]
    assert ours.stock_calls == {}, ours.stock_calls  # not one taken-over stock pass ran
    fused = {name: c["fused"] for name, c in ours.rule_counts.items()}
    # conv+relu, conv+hardtanh, add+relu, mul+hardtanh, two conv1d+relu, linear+relu
    assert fused["FuseActivationPass"] == 7, fused
    assert fused["DecomposeConcatenate"] == 1, fused
    assert fused["Conv1dUnsqueezePass"] == 2, fused
    assert fused["FuseBatchNormPass"] == 1, fused
    # the stock lowering ran them (the counter sees a stock run)
    assert stock.stock_calls.get("FuseActivationPass", 0) >= 1
    assert stock.stock_calls.get("DecomposeConcatenate", 0) >= 1


def test_stock_overwrites_a_fused_activation_the_rule_intersects_ranges(lowered: Any) -> None:
    """Stock FuseActivationPass fuses relu into the conv, then hardtanh into the same conv,
    replacing [0, inf) by [-1, 1]: the delegate lets negative values through."""
    ref, ours, stock = lowered["relu_then_hardtanh"]
    assert stock.error is None
    assert stock.err(ref) > 0.1  # the stock bug, on the real runtime
    assert ours.err(ref) < TOL
    assert ours.payloads != stock.payloads


def test_stock_fails_on_a_shared_conv1d_weight_the_rule_lowers_it(lowered: Any) -> None:
    """Stock Conv1dUnsqueezePass rewrites the shared weight in place: the second
    convolution then sees a 4-D weight and the pass fails; the rule adds the 4-D weight
    as a new constant (once, for both)."""
    ref, ours, stock = lowered["shared_conv1d"]
    assert stock.error is not None and "Conv1dUnsqueezePass" in stock.error
    assert ours.error is None
    assert ours.err(ref) < TOL
    assert ours.rule_counts["Conv1dUnsqueezePass"]["fused"] == 2


def test_quantized_model_delegate_is_byte_identical_to_stock(lowered: Any) -> None:
    """Quantized convs: the conv1d rule's and the cat rule's implicit Q/DQ pairs and relu
    fused into quantized convs give stock's bytes (the pad stays fp32 here: the quantizer
    does not annotate it; the op tests bring a quantized pad)."""
    ref, ours, stock = lowered["quantized"]
    assert ours.error is None and stock.error is None, (ours.error, stock.error)
    assert ours.payloads and ours.payloads == stock.payloads
    assert ours.named == stock.named
    assert ours.err(ref) < QUANT_TOL and stock.err(ref) < QUANT_TOL
    fused = {name: c["fused"] for name, c in ours.rule_counts.items()}
    assert fused.get("Conv1dUnsqueezePass", 0) >= 1, fused
    assert fused.get("DecomposeConcatenate", 0) >= 1, fused
    assert fused.get("FuseActivationPass", 0) >= 1, fused
    assert ours.stock_calls == {}, ours.stock_calls


def test_lone_batch_norms_are_depthwise_convolutions_byte_identical_to_stock(
        lowered: Any) -> None:
    """NCHW, NCL and NC batch norms (the NC one unsqueezed to a 1-D convolution): the
    rule's depthwise convolutions give stock's bytes, on the runtime equal to eager."""
    ref, ours, stock = lowered["lone_batch_norms"]
    assert ours.error is None and stock.error is None, (ours.error, stock.error)
    assert ours.payloads and ours.payloads == stock.payloads
    assert ours.named == stock.named
    assert ours.err(ref) < TOL and stock.err(ref) < TOL
    assert ours.rule_counts["DecomposeBatchNorm"]["fused"] == 3, ours.rule_counts
    assert ours.stock_calls == {}, ours.stock_calls
    assert stock.stock_calls.get("DecomposeBatchNorm", 0) >= 1


def test_stock_gives_two_non_affine_batch_norms_one_set_of_statistics(lowered: Any) -> None:
    """Stock DecomposeBatchNorm names the folded constants after the batch-norm weight;
    without one (affine=False) both are ``_decomposed_bn_weight`` and the second batch
    norm gets the first's: wrong on the runtime. The rule names them per match."""
    ref, ours, stock = lowered["two_non_affine_batch_norms"]
    assert stock.error is None
    assert stock.err(ref) > 0.1  # the stock bug, on the real runtime
    assert ours.err(ref) < TOL
    assert ours.rule_counts["DecomposeBatchNorm"]["fused"] == 2


def test_stock_fails_on_a_batch_norm_after_a_batch_norm(lowered: Any) -> None:
    """Stock DecomposeBatchNorm creates each convolution without a value and re-traces
    only at the end: the second batch norm's check reads its input's value and the pass
    dies (KeyError 'val'). The rule's convolution carries its value."""
    ref, ours, stock = lowered["chained_batch_norms"]
    assert stock.error is not None and "DecomposeBatchNorm" in stock.error, stock.error
    assert ours.error is None
    assert ours.err(ref) < TOL
    assert ours.rule_counts["DecomposeBatchNorm"]["fused"] == 2


def test_identity_clones_go_byte_identical_to_stock(lowered: Any) -> None:
    """Three identity clones removed by the rule; the input -> output copy kept (its
    match declined), as stock keeps it: the same bytes, equal to eager."""
    ref, ours, stock = lowered["clones"]
    assert ours.error is None and stock.error is None, (ours.error, stock.error)
    assert ours.payloads and ours.payloads == stock.payloads
    assert ours.named == stock.named
    assert ours.err(ref) < TOL and stock.err(ref) < TOL
    assert ours.rule_counts["XNNPACKRemoveCloneOpsTransform"]["fused"] == 3, ours.rule_counts
    assert ours.stock_calls == {}, ours.stock_calls
    assert stock.stock_calls.get("XNNPACKRemoveCloneOpsTransform", 0) >= 1


def test_quantized_clone_goes_with_its_dequantize_quantize_pair(lowered: Any) -> None:
    ref, ours, stock = lowered["quantized_clone"]
    assert ours.error is None and stock.error is None, (ours.error, stock.error)
    assert ours.payloads and ours.payloads == stock.payloads
    assert ours.named == stock.named
    assert ours.err(ref) < QUANT_TOL and stock.err(ref) < QUANT_TOL
    assert ours.rule_counts["XNNPACKRemoveCloneOpsTransform"]["fused"] == 1, ours.rule_counts


def test_max_read_for_its_values_is_amax_byte_identical_to_stock(lowered: Any) -> None:
    """Two ``max.dim`` read only through ``getitem(., 0)`` become ``amax`` (the new op keeps
    the old one's debug handle, as stock copies it); the one whose indices are read too is
    declined, as stock leaves it: the same bytes, equal to eager."""
    ref, ours, stock = lowered["max_values"]
    assert ours.error is None and stock.error is None, (ours.error, stock.error)
    assert ours.payloads and ours.payloads == stock.payloads
    assert ours.named == stock.named
    assert ours.err(ref) < TOL and stock.err(ref) < TOL
    assert ours.rule_counts["RemoveGetItemPass"]["fused"] == 2, ours.rule_counts
    assert ours.stock_calls == {}, ours.stock_calls


def test_no_sdpa_pattern_graph_fits_in_an_xnnpack_partition() -> None:
    """Why ConvertToSDPAPass has no rule (passes/xnnpack/convert_to_sdpa.py): every one of
    its pattern graphs holds ops XNNPACK's partitioner (its default configs) has no config
    for, and XNNPACK's serializer has no visitor for the op it would create."""
    import executorch.backends.xnnpack.operators  # noqa: F401  (registers the visitors)
    from executorch.backends.xnnpack.operators.node_visitor import _node_visitor_dict
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.graphs import sdpa

    from fusionkit.passes.xnnpack.convert_to_sdpa import UNPARTITIONED_PATTERN_OPS

    configured = {c.target_name for c in ALL_PARTITIONER_CONFIGS}
    assert not set(UNPARTITIONED_PATTERN_OPS) & configured
    graphs = sdpa.get_graphs()
    assert graphs
    for gm in graphs:
        names = {n.target.__name__.removeprefix("aten.") for n in gm.graph.nodes
                 if n.op == "call_function" and hasattr(n.target, "__name__")}
        assert set(UNPARTITIONED_PATTERN_OPS) <= names, sorted(names)
    assert not any("scaled_dot_product_attention" in k for k in _node_visitor_dict)
    assert "ConvertToSDPAPass" in pr.TAKEN_OVER_PASSES


def test_rules_disabled_run_the_stock_passes() -> None:
    """``preprocess_rules.disabled()`` is the switch the op-test twins use."""
    assert pr.is_enabled()
    with pr.disabled():
        assert not pr.is_enabled()
    assert pr.is_enabled()
