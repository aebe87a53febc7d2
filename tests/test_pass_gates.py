"""Skipping backend preprocess passes with nothing to do changes no byte (issue 13).

Every model of the corpus -- a Hugging Face Llama decoder and a ResNet from the zoo, a
network of the activations, batch norms, pools, pads, cats and conv1d the gated passes
act on, and a PT2E-quantized one -- is lowered through each adapter twice: gating off
(:func:`pass_gating.disabled`) and gating on under :func:`pass_gating.checking`, which also
runs every skipped pass on a deep copy and fails on any change. The two ``.pte`` files
must be byte-identical; the XNNPACK one runs and matches eager. A recorder under the
the gates sees which pass calls change the program with gating off: each of those
passes must have run with gating on.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.pass_base import PassResult
from executorch.exir.program._program import _transform
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer
from torch import nn

import fusionkit.backends.vulkan_adapter as vk
import fusionkit.backends.xnnpack_adapter as xa
from fusionkit.backends.vulkan_adapter import pass_gates as vulkan_gates
from fusionkit.backends.xnnpack_adapter import pass_gates as xnnpack_gates
from fusionkit.integration import pass_gating
from fusionkit.integration.pass_gating import GateViolation, PassGate

BACKENDS = ("vulkan", "xnnpack")
_MODULES = {"vulkan": "executorch.backends.vulkan.vulkan_preprocess",
            "xnnpack": "executorch.backends.xnnpack._passes"}


# ----------------------------------------------------------------------------- corpus


class Activations(nn.Module):
    """What the gated passes act on: conv->bn, a lone bn, conv->relu/hardtanh,
    linear->relu, clamp, max pool (with indices), pad, bilinear upsample, PReLU, a cat of
    8 tensors, conv1d."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1)
        self.lone_bn = nn.BatchNorm2d(8)
        self.prelu = nn.PReLU()
        self.conv1d = nn.Conv1d(8, 4, 3, padding=1)
        self.lin = nn.Linear(16, 16)
        with torch.no_grad():
            for bn in (self.bn, self.lone_bn):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        z = F.hardtanh(self.conv2(y), -0.5, 0.5)
        z = self.lone_bn(z + y)
        z = F.max_pool2d(z, 2)
        z = F.pad(z, (1, 1, 1, 1))
        z = F.interpolate(z, scale_factor=2, mode="bilinear", align_corners=False)
        z = self.prelu(z)
        z = torch.cat([z[:, i : i + 1] for i in range(8)], 1)
        s = self.conv1d(z.flatten(2))[..., :16]
        return torch.clamp(torch.relu(self.lin(s)), -1.0, 1.0)


class QuantNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3)
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = self.c2(F.pad(x, (1, 1, 1, 1)))
        return self.lin(x.mean((2, 3)))


@dataclass
class Case:
    name: str
    module: nn.Module  # the eager reference (the converted model when quantized)
    inputs: tuple[torch.Tensor, ...]
    exported: Any
    atol: float

    def export(self) -> Any:
        """A fresh program: ExecuTorch's Vulkan lowering deletes constants from the one
        it is given (tests/zoo_models.py)."""
        return copy.deepcopy(self.exported)


def _zoo(name: str) -> Case:
    from zoo_models import TOLERANCE, build

    c = build(name)
    return Case(name, c.exported.module(), c.inputs, c.exported, TOLERANCE)


def _activations() -> Case:
    torch.manual_seed(0)
    m = Activations().eval()
    x = (torch.randn(1, 3, 8, 8),)
    return Case("activations", m, x, torch.export.export(m, x), 1e-4)


def _quantized() -> Case:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(1)
    x = (torch.randn(1, 4, 8, 8),)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(QuantNet().eval(), x).module(), quantizer)
    for _ in range(4):
        prepared(torch.randn(1, 4, 8, 8))
    q = convert_pt2e(prepared)
    # int8 requantization: a value may land one output step away
    return Case("quantized", q, x, torch.export.export(q, x), 0.05)


def _tiny_llama() -> Case:
    """The benchmark's Llama block (RMSNorm, RoPE, SiLU MLP), one layer."""
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.models import TinyLlama

    torch.manual_seed(0)
    m = TinyLlama(1).eval()
    x = (torch.randn(1, 8, 64),)
    return Case("llama", m, x, torch.export.export(m, x), 1e-4)


CASES: dict[str, Callable[[], Case]] = {
    "llama": _tiny_llama, "resnet": lambda: _zoo("resnet"),
    "activations": _activations, "quantized": _quantized,
}


# ----------------------------------------------------------------------------- lowering


@dataclass
class Lowering:
    pte: bytes
    program: Any
    counts: dict[str, dict[str, int]]
    changed: collections.Counter[str]  # pass calls that changed the program (gating off)


@contextlib.contextmanager
def _recorder(backend: str, changed: collections.Counter[str]) -> Iterator[None]:
    """Under the gates (installed first, so the gates wrap it): records every pass call
    that reaches ExecuTorch's ``_transform`` and changes the program's structure."""
    import importlib

    module = importlib.import_module(_MODULES[backend])
    orig = module._transform

    def recording(program: Any, *passes: Any, **kwargs: Any) -> Any:
        before = pass_gating.structure(program, values=False)
        result = orig(program, *passes, **kwargs)
        if pass_gating.structure(result, values=False) != before:
            changed[type(passes[0]).__name__] += 1
        return result

    module._transform = recording
    try:
        yield
    finally:
        module._transform = orig


def lower(case: Case, backend: str, gating: bool) -> Lowering:
    adapter: Any = vk if backend == "vulkan" else xa
    part = vk.VulkanPartitioner() if backend == "vulkan" else xa.XnnpackPartitioner()
    changed: collections.Counter[str] = collections.Counter()
    pass_gating.reset_counts()
    mode = pass_gating.checking() if gating else pass_gating.disabled()
    record = _recorder(backend, changed) if not gating else contextlib.nullcontext()
    with record, mode:
        prog = to_edge_transform_and_lower(case.export(), transform_passes=adapter.transform_passes(),
                                           partitioner=[part])
    counts = pass_gating.counts()
    return Lowering(bytes(prog.to_executorch().buffer), prog, counts, changed)


@pytest.fixture(scope="module")
def cases() -> Callable[[str], Case]:
    built: dict[str, Case] = {}

    def get(name: str) -> Case:
        if name not in built:
            built[name] = CASES[name]()
        return built[name]

    return get


@pytest.fixture(scope="module")
def lowered(cases: Callable[[str], Case]) -> Callable[[str, str], tuple[Lowering, Lowering]]:
    """(gating off, gating on under checking) per (backend, case), lowered once."""
    done: dict[tuple[str, str], tuple[Lowering, Lowering]] = {}

    def get(backend: str, name: str) -> tuple[Lowering, Lowering]:
        if (backend, name) not in done:
            case = cases(name)
            done[(backend, name)] = (lower(case, backend, False), lower(case, backend, True))
        return done[(backend, name)]

    return get


PAIRS = [(b, c) for b in BACKENDS for c in CASES]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "name"), PAIRS)
def test_same_bytes_with_and_without_gating(lowered: Any, backend: str, name: str) -> None:
    off, on = lowered(backend, name)
    assert off.counts == {}, "disabled: every pass runs, none is even counted"
    skipped = {k: v["skipped"] for k, v in on.counts.items() if v["skipped"]}
    assert skipped, "the corpus model skips something"
    assert on.pte == off.pte


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "name"), PAIRS)
def test_every_pass_that_changes_the_program_runs(lowered: Any, backend: str, name: str) -> None:
    off, on = lowered(backend, name)
    for cls, n in off.changed.items():
        assert on.counts.get(cls, {}).get("ran", 0) >= n, (cls, n, on.counts.get(cls))


def test_the_corpus_triggers_the_gated_passes(lowered: Any) -> None:
    """Not a vacuous corpus: passes whose trigger the models contain ran (and, by the
    tests above, gave the same bytes)."""
    ran: dict[str, set[str]] = {}
    for backend, name in PAIRS:
        for cls, c in lowered(backend, name)[1].counts.items():
            if c["ran"]:
                ran.setdefault(backend, set()).add(cls)
    assert {"RemoveRedundantCopyPass"} <= ran["xnnpack"]
    # fusionkit rules run in their place inside XNNPACK preprocess (preprocess_rules)
    assert not set(xa.preprocess_rules.TAKEN_OVER_PASSES) & ran["xnnpack"]
    # fusionkit rules run in their place inside Vulkan preprocess (preprocess_rules)
    assert not set(vk.preprocess_rules.TAKEN_OVER_PASSES) & ran["vulkan"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_xnnpack_gated_pte_runs_and_matches_eager(lowered: Any, cases: Any, name: str) -> None:
    case = cases(name)
    _, on = lowered("xnnpack", name)
    got = _load_for_executorch_from_buffer(on.pte).forward(case.inputs)[0]
    with torch.no_grad():
        want = case.module(*case.inputs)
    want = want[0] if isinstance(want, tuple) else want
    assert float((got - want).abs().max()) <= case.atol


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "resnet"])
def test_vulkan_gated_payloads_simulate_like_eager(lowered: Any, cases: Any, name: str) -> None:
    case = cases(name)
    _, on = lowered("vulkan", name)
    got = vk.simulate(on.program, *case.inputs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    with torch.no_grad():
        want = case.module(*case.inputs)
    want = want[0] if isinstance(want, tuple) else want
    assert float((got - want).abs().max()) <= case.atol


# ----------------------------------------------------------------------------- gate faults


def _with_gate(monkeypatch: pytest.MonkeyPatch, cls_name: str, trigger: Any) -> None:
    table: Any = xnnpack_gates.PASS_GATES  # the faults planted are XNNPACK passes
    key = next(k for k in table if k.endswith("." + cls_name))
    old = table[key]
    monkeypatch.setitem(table, key, PassGate(trigger, old.retraces, old.always_modified, old.dce))


@pytest.mark.slow
def test_a_wrong_gate_is_caught_by_checking_and_by_the_bytes(
        monkeypatch: pytest.MonkeyPatch, lowered: Any, cases: Any) -> None:
    """A gate that says 'nothing to do' where the layout pass tags and reshapes the
    convolutions' inputs (since the batch-norm, clone and activation passes are rules,
    it is the stock pass that changes every corpus model): checking() raises, and
    without it the lowering differs -- both proofs above can fail."""
    off, _ = lowered("xnnpack", "activations")
    _with_gate(monkeypatch, "ChannelsLastTaggedReshapePass", lambda ep, p: False)
    with pytest.raises(Exception) as info:
        lower(cases("activations"), "xnnpack", True)
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    assert any(isinstance(x, GateViolation) for x in chain), chain
    xa.partitioner.PREPROCESS_SCOPE.reset()
    pass_gating.reset_counts()
    try:  # no layout conversions: other bytes (or a delegate XNNPACK refuses)
        prog = to_edge_transform_and_lower(cases("activations").export(),
                                           transform_passes=xa.transform_passes(),
                                           partitioner=[xa.XnnpackPartitioner()])
        wrong = bytes(prog.to_executorch().buffer) != off.pte
    except RuntimeError as e:
        wrong = "not supported in XNNPACK Delegate" in str(e)
        xa.partitioner.PREPROCESS_SCOPE.reset()
    assert pass_gating.counts()["ChannelsLastTaggedReshapePass"]["skipped"] > 0
    assert wrong


def test_a_gate_that_raises_lets_its_pass_run(monkeypatch: pytest.MonkeyPatch, lowered: Any,
                                              cases: Any) -> None:
    off, _ = lowered("xnnpack", "quantized")

    def broken(ep: Any, p: Any) -> bool:
        raise RuntimeError("gate bug")

    for cls in ("PropagateCustomMetaPass", "ConstPropPass", "RemoveRedundantCopyPass"):
        _with_gate(monkeypatch, cls, broken)
    on = lower(cases("quantized"), "xnnpack", True)
    for cls in ("PropagateCustomMetaPass", "ConstPropPass", "RemoveRedundantCopyPass"):
        assert on.counts[cls]["skipped"] == 0 and on.counts[cls]["ran"] > 0
    assert on.pte == off.pte


# ----------------------------------------------------------------------------- unit level


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.w) * 2.0


@pytest.fixture()
def small() -> Any:
    torch.manual_seed(0)
    return to_edge(torch.export.export(Small().eval(), (torch.randn(2, 8),))).exported_program()


def _marks_changed(gm: torch.fx.GraphModule) -> PassResult:
    """An unknown pass that reports a change without retracing."""
    return PassResult(gm, True)


def test_retracing_pass_skipped_only_on_a_settled_graph(small: Any) -> None:
    from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass

    t = pass_gating.gated_transform(_transform, xnnpack_gates.PASS_GATES)
    pass_gating.reset_counts()
    assert t(small, DimOrderOpsRevertPass()) is small  # nothing to revert, settled
    touched = t(small, _marks_changed)  # unknown pass: runs, and unsettles the graph
    assert touched is not small and touched.graph_module is small.graph_module
    retraced = t(touched, DimOrderOpsRevertPass())  # must run: a retrace may differ now
    assert retraced is not touched and retraced.graph_module is not touched.graph_module
    assert t(retraced, DimOrderOpsRevertPass()) is retraced  # settled again
    assert pass_gating.counts()["DimOrderOpsRevertPass"] == {"skipped": 2, "ran": 1}


#: AddmmToLinearTransform gated as an in-place, always-modified, dead-code-eliminating pass
#: whose trigger finds nothing: what is left to decide is the mechanism's own
_FINDS_NOTHING = {"executorch.backends.transforms.addmm_mm_to_linear.AddmmToLinearTransform":
                  PassGate(lambda ep, p: False, always_modified=True, dce=True)}


def test_dead_code_and_duplicate_getitems_make_always_modified_passes_run(small: Any) -> None:
    from executorch.backends.transforms.addmm_mm_to_linear import AddmmToLinearTransform

    t = pass_gating.gated_transform(_transform, _FINDS_NOTHING)
    assert t(small, AddmmToLinearTransform()) is small  # the trigger finds nothing
    g = small.graph_module.graph
    x = [n for n in g.nodes if n.op == "placeholder"][-1]  # the user input
    neg = pass_gating.edge_ops().aten.neg.default
    with g.inserting_after(x):
        dead = g.call_function(neg, (x,))  # unused: DCE would erase it
    dead.meta["val"] = x.meta["val"]
    result = t(small, AddmmToLinearTransform())
    assert result is not small, "ran"
    assert not any(n.target == neg for n in result.graph_module.graph.nodes)

    gm = small.graph_module
    gm2 = copy.deepcopy(gm)
    node = next(n for n in gm2.graph.nodes if n.op == "call_function")
    with gm2.graph.inserting_after(node):
        a = gm2.graph.call_function(operator.getitem, (node, 0))
        b = gm2.graph.call_function(operator.getitem, (node, 0))
    assert pass_gating.has_duplicate_getitems(gm2) and not pass_gating.has_duplicate_getitems(gm)
    assert a is not b


def test_disabled_runs_every_pass(small: Any) -> None:
    from executorch.backends.transforms.addmm_mm_to_linear import AddmmToLinearTransform

    t = pass_gating.gated_transform(_transform, _FINDS_NOTHING)
    with pass_gating.disabled():
        assert not pass_gating.is_enabled()
        assert t(small, AddmmToLinearTransform()) is not small
    assert pass_gating.is_enabled()


# ----------------------------------------------------------------------------- the table


def test_every_table_entry_names_a_pass_class() -> None:
    import importlib

    for key in [*vulkan_gates.PASS_GATES, *xnnpack_gates.PASS_GATES]:
        module, _, name = key.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert f"{cls.__module__}.{cls.__qualname__}" == key


def test_every_default_xnnpack_pass_is_in_the_table() -> None:
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    for cls in XNNPACKPassManager(None).passes:  # type: ignore[arg-type]
        if cls.__name__ in xa.preprocess_rules.TAKEN_OVER_PASSES:  # run as rules: no gate
            assert f"{cls.__module__}.{cls.__qualname__}" not in xnnpack_gates.PASS_GATES
            continue
        assert f"{cls.__module__}.{cls.__qualname__}" in xnnpack_gates.PASS_GATES, cls


def test_pattern_graphs_hold_the_targets_the_gates_require() -> None:
    """ConvertToUpsampleBilinear2d matches ExecuTorch's pattern graphs (targets compared
    exactly): each is the one op. (ConvertToSDPAPass's graphs: tests/test_xnnpack_rules.py,
    its takeover.)"""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d

    upsample = pass_gating.edge_ops().aten.upsample_bilinear2d.vec
    for gm in bilinear_2d.get_graphs():
        assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [upsample]
