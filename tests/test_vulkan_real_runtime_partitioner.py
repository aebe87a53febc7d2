"""The runtime-aware partitioner on the real Vulkan runtime (issue 24, item 3).

Held-out programs that the 1.5.1 partitioner delegates and the runtime built here refuses
or miscomputes, each for another reason than a missing operator:

* a shader variant the runtime lacks: an int32 ``eq`` (``binary_eq_texture3d_int32`` /
  ``binary_eq_buffer_int32`` are not in its registry);
* a runtime condition ``check()`` knows: a lone ``BatchNorm2d(affine=False)`` (the runtime
  prepacks the weight, which is None);
* a preprocess fusion declined: an int4 weight-only linear with N % 8 != 0 or one input
  row, whose ``dequantize_per_channel`` (which the runtime lacks) then stays, and with it
  a linear whose weight is no constant.

With the adapter's partitioner given the probed inventory, every program loads and runs
equal to eager, and the kept-off record names the node and the runtime fact; with
stock's partitioner (and with ours not given the inventory) the runtime's failure is
reproduced, in a child; ``check()`` and the simulator, given the same inventory, agree
with the runtime on every program. Without the inventory the adapter's partitioner judges
by what the wheel implies and keeps off the same nodes (issue 45, item 3).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.runtime_probe import RuntimeInventory

pytest.importorskip("torchao")


class Compare(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (self.fn(a, b).to(torch.float32) + 1.0) * (a.to(torch.float32) - 0.5)


class LoneBatchNorm(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(c, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(x * 1.5)) - 0.25


class Int4Linear(nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.lin = nn.Linear(k, n, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) + 1.0


def _int4(model: nn.Module, x: tuple[torch.Tensor, ...]) -> nn.Module:
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        VulkanQuantizer,
        get_symmetric_quantization_config,
    )
    from test_vulkan_preprocess_quantized_rules import _calibrated

    q = VulkanQuantizer().set_global(get_symmetric_quantization_config(is_dynamic=False,
                                                                       weight_bits=4))
    return _calibrated(model.eval(), x, q)  # type: ignore[no-any-return]


@dataclass
class Case:
    name: str
    #: the runtime fact the partitioner must name, and the node it keeps off (a substring)
    fact: str
    node: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    #: path -> lowered program and what the static tools said
    runs: dict[str, Lowered] = field(default_factory=dict)


@dataclass
class Lowered:
    pte: bytes
    kept_off: list[Any]
    check: list[str]
    simulator: str  # ok | wrong | stopped: ...
    real: rt.RunResult | None = None


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(24)
    out = []
    for shape in ((2, 8), (3, 5, 4)):
        a = torch.randint(0, 3, shape, generator=g, dtype=torch.int32)
        b = torch.randint(0, 3, shape, generator=g, dtype=torch.int32)
        out.append(Case(f"eq int32 {list(shape)}", "missing_shader", "eq", Compare(torch.eq),
                        (a, b)))
    for c, hw in ((4, 6), (3, 5)):
        bn = LoneBatchNorm(c).eval()
        with torch.no_grad():
            bn.bn.running_mean.uniform_(-1, 1, generator=g)
            bn.bn.running_var.uniform_(0.5, 2, generator=g)
        out.append(Case(f"BatchNorm2d({c}, affine=False)", "not_constant", "batch_norm", bn,
                        (torch.randn(1, c, hw, hw, generator=g),)))
    for rows, n in ((6, 12), (1, 8)):
        x = (torch.randn(rows, 16, generator=g),)
        out.append(Case(f"int4 linear M={rows} N={n}", "missing_operator", "dequantize_per_channel",
                        _int4(Int4Linear(16, n), x), x))
    return out


PATHS = ("ours", "ours, no inventory", "stock")


def _lower(case: Case, path: str, inv: RuntimeInventory) -> Lowered:
    from executorch.exir import to_edge_transform_and_lower
    from vulkan_real_programs import pattern_graphs_once, stock_partitioner

    import fusionkit.backends.vulkan_adapter as va

    ep = torch.export.export(case.model, case.inputs)
    with pattern_graphs_once():
        if path == "stock":
            va.uninstall()
            part = stock_partitioner()
            edge = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[part])
        else:
            part = va.VulkanPartitioner(runtime=inv if path == "ours" else None)
            edge = to_edge_transform_and_lower(
                copy.deepcopy(ep), transform_passes=va.transform_passes(partitioner=part),
                partitioner=[part])
    et = edge.to_executorch()
    from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError, unload

    try:
        sim = pytree.tree_leaves(va.simulate(et, *case.inputs, runtime=inv))
        said = "ok" if _close(sim, _eager(case)) else "wrong"
    except SimulationError as e:
        said = ("wrong: " if getattr(getattr(e, "condition", None), "effect", "") == "garbage"
                else "stopped: ") + str(e).splitlines()[0]
    finally:
        unload(et)
    return Lowered(bytes(et.buffer), list(getattr(part, "kept_off_nodes", [])),
                   [str(p) for p in va.check(et, runtime=inv)], said)


def _eager(case: Case) -> list[torch.Tensor]:
    with torch.no_grad():
        return pytree.tree_leaves(case.model(*case.inputs))  # type: ignore[no-any-return]


def _close(got: Any, want: list[torch.Tensor]) -> bool:
    return (got is not None and len(got) == len(want) and all(
        g.shape == w.shape and torch.allclose(g.double(), w.double(), atol=1e-4, rtol=1e-4)
        for g, w in zip(got, want, strict=True)))


def _outcome(case: Case, low: Lowered) -> str:
    assert low.real is not None
    if not low.real.ok:
        return "refused"
    return "ok" if _close(low.real.outputs, _eager(case)) else "wrong"


@pytest.fixture(scope="module")
def cases(probed: RuntimeInventory) -> list[Case]:
    out = _cases()
    for case in out:
        for path in PATHS:
            case.runs[path] = _lower(case, path, probed)
    todo = [(c, low) for c in out for low in c.runs.values()]
    results = rt.run_many_in_child([rt.Job(low.pte, list(c.inputs)) for c, low in todo],
                                   timeout=300)
    for (_, low), res in zip(todo, results, strict=True):
        low.real = res
    return out


def test_ours_runs_equal_to_eager_and_names_what_it_kept_off(cases: list[Case]) -> None:
    bad = []
    for case in cases:
        low = case.runs["ours"]
        if _outcome(case, low) != "ok":
            bad.append(f"{case.name}: {_outcome(case, low)} {low.real.message if low.real else ''}")
        facts = [k for k in low.kept_off if k.fact == case.fact and case.node in k.node]
        if not facts:
            bad.append(f"{case.name}: no {case.fact} record for a `{case.node}` node: "
                       f"{[str(k) for k in low.kept_off]}")
        elif "probed" not in facts[0].reason or facts[0].node not in str(facts[0]):
            bad.append(f"{case.name}: the reason does not name the runtime: {facts[0]}")
    assert not bad, bad
    int4 = [c for c in cases if c.fact == "missing_operator"]
    for case in int4:  # the linear needing the dequantized weight goes with it
        kept = case.runs["ours"].kept_off
        assert any(k.fact == "not_constant" and "prepacks argument 1 (weight)" in k.reason
                   for k in kept), [str(k) for k in kept]
        dq = next(k for k in kept if "dequantize_per_channel" in k.node)
        assert "linear_weight_int4" in dq.reason, dq  # the preprocess rule's decline


def test_stock_fails_and_the_unprobed_partitioner_keeps_off_the_same(cases: list[Case]) -> None:
    """Without the inventory the partitioner judges by what the wheel implies (its shader
    templates: no ``binary_eq_texture3d_int32``; its registry less the ops whose shaders it
    lacks: no ``dequantize_per_channel``), so it keeps off the same nodes for the same facts
    and its programs run equal to eager too (issue 45, item 3)."""
    bad = []
    for case in cases:
        low = case.runs["stock"]
        if _outcome(case, low) == "ok":
            bad.append(f"{case.name} [stock]: ran equal to eager")
        blind, ours = case.runs["ours, no inventory"], case.runs["ours"]
        if _outcome(case, blind) != "ok":
            bad.append(f"{case.name} [ours, no inventory]: {_outcome(case, blind)}")
        if ({(k.node, k.fact) for k in blind.kept_off}
                != {(k.node, k.fact) for k in ours.kept_off}):
            bad.append(f"{case.name}: kept off {[str(k) for k in blind.kept_off]} without the "
                       f"inventory, {[str(k) for k in ours.kept_off]} with it")
    for case in cases[:4]:  # the shader and the batch norm: refused by stock too
        msg = case.runs["stock"].real.message or ""  # type: ignore[union-attr]
        want = "ShaderInfo" if case.fact == "missing_shader" else "native_batch_norm"
        if want not in msg:
            bad.append(f"{case.name} [stock]: {msg[:300]}")
    assert not bad, bad


def test_check_and_the_simulator_agree_with_the_runtime_on_every_program(
        cases: list[Case]) -> None:
    wrong = []
    for case in cases:
        for path, low in case.runs.items():
            real = _outcome(case, low)
            sim = "refused" if low.simulator.startswith("stopped") else low.simulator.split(":")[0]
            if sim != real or bool(low.check) != (real != "ok"):
                wrong.append(f"{case.name} [{path}]: runtime {real} "
                             f"({low.real.message if low.real else ''}); simulator "
                             f"{low.simulator}; check {low.check}")
    assert not wrong, wrong
