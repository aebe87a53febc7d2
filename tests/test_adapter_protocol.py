"""A backend adapter as a new backend author writes one, from ``fusionkit``'s facade alone.

The toy backend below runs a fused ``toy::swish`` (``x * sigmoid(x)``) that its runtime
takes for float32 only. Its adapter is a :class:`fusionkit.BackendAdapter`: a rule set,
the runtime's condition (an :class:`~fusionkit.ExecutionTarget` whose delegate refuses
float64), an oracle (the lowered program run where the toy runs it) and the install trio
(a :class:`~fusionkit.PatchSet`; it takes nothing over: its rules are a transform pass).
This file imports nothing of fusionkit but the facade (checked on its own source). The
three shipped adapters are the same protocol, and every place that runs rules runs them
through :func:`fusionkit.run_rules`.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from fusionkit import (
    BackendAdapter,
    Delegate,
    ExecutionTarget,
    FusionPass,
    PatchSet,
    Rule,
    capture,
    op,
    ref,
    replace_with,
    run_rules,
)


# --- the toy backend's adapter, complete (lines counted by the test below) ---
@torch.library.custom_op("toy::swish", mutates_args=())
def swish(x: torch.Tensor) -> torch.Tensor:
    """The toy runtime's fused kernel."""
    return x * torch.sigmoid(x)


swish.register_fake(lambda x: torch.empty_like(x))


def toy_refusal(node: Any) -> str | None:
    """What the toy runtime cannot execute: a swish on anything but float32."""
    dtype = node.meta["val"].dtype
    return None if dtype == torch.float32 else f"the toy runtime's swish takes float32, not {dtype}"


class ToyAdapter:
    """The toy backend: one rule, its runtime's condition, its oracle, the install trio."""

    def __init__(self) -> None:
        self.patches = PatchSet("toy adapter (takes nothing over)", lambda: [])
        self.install, self.uninstall = self.patches.install, self.patches.uninstall
        self.is_installed = self.patches.is_installed

    def rule_sets(self) -> dict[str, list[Rule]]:
        x = capture("x")
        return {"toy": [Rule("swish", op("aten.mul.Tensor", x, op("aten.sigmoid.default", x)),
                             replace_with("toy.swish.default", ref("x")))]}

    def execution_target(self) -> ExecutionTarget:
        return ExecutionTarget([Delegate("toy", toy_refusal, frozenset({"toy"}))],
                               assume_registered_backend_ops=False)

    def oracle(self) -> Callable[[Any, tuple[Any, ...]], list[torch.Tensor]]:
        return lambda edge, inputs: list(edge.exported_program().module()(*inputs))

    def takeover_points(self) -> dict[str, str]:
        return {}

    def transform_passes(self) -> list[FusionPass]:
        return [FusionPass(self.rule_sets()["toy"], name="toy", target=self.execution_target())]
# --- end of the toy backend's adapter ---


def _toy_section() -> list[str]:
    lines = Path(__file__).read_text().splitlines()
    begin = next(i for i, s in enumerate(lines) if s.startswith("# --- the toy backend"))
    end = next(i for i, s in enumerate(lines) if s.startswith("# --- end of the toy"))
    return [s for s in lines[begin + 1:end] if s.strip()]


def test_this_file_uses_only_the_facade() -> None:
    tree = ast.parse(Path(__file__).read_text())
    named = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    named += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert [m for m in named if m and m.startswith("fusionkit") and m != "fusionkit"] == []
    assert 0 < len(_toy_section()) <= 60


class Swishes(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * torch.sigmoid(x) + 1, (y * torch.sigmoid(y)).float()


INPUTS = (torch.randn(4, 8), torch.randn(3, 5, dtype=torch.float64))


def test_the_toy_adapter_is_one() -> None:
    toy = ToyAdapter()
    assert isinstance(toy, BackendAdapter)
    assert not toy.is_installed()
    with toy.install() as installation:
        assert installation.installed_here and toy.is_installed()
        with toy.install() as again:  # idempotent: the inner one undoes nothing
            assert not again.installed_here
        assert toy.is_installed()
    assert not toy.is_installed()


def test_the_toy_backend_fuses_declines_with_its_reason_and_equals_eager() -> None:
    toy = ToyAdapter()
    (fusion,) = passes = toy.transform_passes()
    ep = torch.export.export(Swishes(), INPUTS)
    edge = to_edge_transform_and_lower(ep, transform_passes=passes)
    report = fusion.report.rules["swish"]
    assert report.fused == 1
    (decline,) = report.declines
    assert decline.step == "executable" and "takes float32, not torch.float64" in decline.reason
    ops = [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"]
    assert sum("toy.swish" in t for t in ops) == 1 and sum("sigmoid" in t for t in ops) == 1
    got = toy.oracle()(edge, INPUTS)
    for g, w in zip(got, Swishes()(*INPUTS), strict=True):
        torch.testing.assert_close(g, w)


def test_run_rules_is_the_engine_under_the_pass() -> None:
    toy = ToyAdapter()
    edge = to_edge_transform_and_lower(torch.export.export(Swishes(), INPUTS))
    program = edge.exported_program()
    run = run_rules(program, toy.rule_sets()["toy"], target=toy.execution_target(), rounds=4)
    assert run.modified and run.fused == 1 and len(run.rounds) == 2  # the second finds none
    assert [d.step for d in run.matches.declined] == ["executable"]
    assert run.new_roots[0].target.name() == "toy::swish"
    again = run_rules(program, toy.rule_sets()["toy"], target=toy.execution_target())
    assert not again.modified and again.fused == 0


# --- the shipped adapters: the same protocol, the same engine

ADAPTERS = ("vulkan", "xnnpack", "arm")


@pytest.mark.parametrize("name", ADAPTERS)
def test_the_shipped_adapters_are_backend_adapters(name: str) -> None:
    adapter = importlib.import_module(f"fusionkit.backends.{name}_adapter")
    assert isinstance(adapter, BackendAdapter)
    sets = adapter.rule_sets()
    assert sets and all(isinstance(r, Rule) for rules in sets.values() for r in rules)
    assert isinstance(adapter.execution_target(), ExecutionTarget)
    assert adapter.takeover_points()  # each replaces stock passes while installed
    was = adapter.is_installed()
    with adapter.install():
        assert adapter.is_installed()
    assert adapter.is_installed() == was


#: core modules the shipped adapters still import past the facade (file -> modules); none
#: may be added: what an adapter needs goes into ``fusionkit.EXPORTS``
PAST_THE_FACADE: dict[str, set[str]] = {
    "vulkan_adapter/delegation.py": {"fusionkit.edit.meta_cache"},
    "vulkan_adapter/probe.py": {"fusionkit.edit.probe"},
    "vulkan_adapter/inspect/runtime_conditions.py": {"fusionkit.check.operand_dtypes"},
}
#: what an adapter may import besides the facade: the integration API, the rule sets,
#: the other adapters
PUBLIC_PACKAGES = ("fusionkit.integration", "fusionkit.passes", "fusionkit.backends")


def test_adapters_reach_the_core_through_the_facade() -> None:
    backends = Path(__file__).resolve().parent.parent / "backends"
    found: dict[str, set[str]] = {}
    for path in sorted(backends.rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            module = n.module if isinstance(n, ast.ImportFrom) and not n.level else None
            if module and module.startswith("fusionkit.") \
                    and not module.startswith(PUBLIC_PACKAGES):
                found.setdefault(path.relative_to(backends).as_posix(), set()).add(module)
    assert found == PAST_THE_FACADE
    for preprocess in ("xnnpack_adapter", "arm_adapter", "vulkan_adapter"):
        assert f"{preprocess}/preprocess_rules.py" not in found  # the engine, from the facade


def _engine_callers(run: Callable[[], Any]) -> list[str]:
    """``module.function`` of every caller of :func:`fusionkit.run_rules` while ``run()`` runs."""
    engine = run_rules.__code__
    callers: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is engine and frame.f_back is not None:
            caller = frame.f_back
            callers.append(f"{caller.f_globals.get('__name__')}.{caller.f_code.co_name}")

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return callers


class ConvBnRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.fixture()
def conv_bn() -> Iterator[tuple[torch.nn.Module, tuple[torch.Tensor]]]:
    torch.manual_seed(0)
    yield ConvBnRelu().eval(), (torch.randn(1, 3, 8, 8),)


def test_the_pass_and_the_xnnpack_preprocess_run_the_engine(conv_bn: Any) -> None:
    xnnpack = importlib.import_module("fusionkit.backends.xnnpack_adapter")
    model, inputs = conv_bn
    ep = torch.export.export(model, inputs)
    x = capture("x")
    mine = FusionPass([Rule("relu_relu", op("aten.relu.default", op("aten.relu.default", x)),
                            replace_with("aten.relu.default", ref("x")))])
    callers = _engine_callers(lambda: to_edge_transform_and_lower(
        ep, transform_passes=[mine], partitioner=[xnnpack.XnnpackPartitioner()]))
    assert "fusionkit.fusion_pass.call" in callers
    assert "fusionkit.backends.xnnpack_adapter.preprocess_rules.call" in callers


def test_the_quantize_step_runs_the_engine(conv_bn: Any) -> None:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    step = importlib.import_module("fusionkit.backends.quantize_step")
    model, inputs = conv_bn
    gm = torch.export.export(model, inputs).module()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    with step.install():
        callers = _engine_callers(lambda: prepare_pt2e(gm, quantizer))  # type: ignore[arg-type]
    assert callers == ["fusionkit.backends.quantize_step._fold"]  # (the conv fold; no batch
    # norm is left for the linear one)
    assert len(step.last_report().folded) == 1


def test_the_vulkan_preprocess_runs_the_engine(conv_bn: Any) -> None:
    vulkan = importlib.import_module("fusionkit.backends.vulkan_adapter")
    model, inputs = conv_bn
    ep = torch.export.export(model, inputs)
    callers = _engine_callers(lambda: to_edge_transform_and_lower(
        ep, transform_passes=vulkan.transform_passes(),
        partitioner=[vulkan.VulkanPartitioner()]))
    assert "fusionkit.fusion_pass.call" in callers  # the transform passes
    assert "fusionkit.backends.vulkan_adapter.preprocess_rules.__call__" in callers
    assert "fusionkit.backends.vulkan_adapter.install._replace_all_fusable_subgraphs" in callers


def test_the_arm_preprocess_runs_the_engine(conv_bn: Any) -> None:
    pytest.importorskip("executorch.backends.arm.tosa.partitioner")
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

    arm = importlib.import_module("fusionkit.backends.arm_adapter")
    model, inputs = conv_bn
    ep = torch.export.export(model, inputs)
    callers = _engine_callers(lambda: to_edge_transform_and_lower(
        ep, partitioner=[arm.TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))]))
    assert "fusionkit.backends.arm_adapter.preprocess_rules.__call__" in callers
