"""Every function that takes a program takes all three shapes alike (issue 23, point 5).

``torch.export.export`` returns an ``ExportedProgram``, ``to_edge`` an
``EdgeProgramManager``, ``.to_executorch()`` an ``ExecutorchProgramManager``.
``find_matches``, ``why_not``, ``FusionPass``, the app's ``explain``/``lower``,
the Vulkan adapter's ``check`` and ``simulate``, and ``simulate_model`` take
each of them and give the same answer as with the ``ExportedProgram`` inside;
anything else is a ``TypeError`` naming what was passed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from executorch.exir import EdgeProgramManager, ExecutorchProgramManager, to_edge

from fusionkit import FusionPass, Rule, capture, find_matches, op, ref, replace_with, why_not
from fusionkit.app.lowering import edge_program, explain, lower
from fusionkit.app.runtime import run_pte
from fusionkit.program import as_exported_program
from fusionkit.targets import op_key


class Silu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * torch.sigmoid(x)) + 1.0


X = torch.randn(2, 8)


def _silu_rule() -> Rule:
    x = capture("x")
    # a core op with an out variant: executable on the portable runtime
    return Rule("silu_as_relu_sigmoid", op("aten.mul.Tensor", x, op("aten.sigmoid.default", x)),
                replace_with("aten.mul.Tensor", ref("x"), ref("x")))


def _shape(ms: Any) -> tuple[list[tuple[str, str]], list[str]]:
    return ([(m.rule.name, m.root.name) for m in ms.accepted], [str(d) for d in ms.declined])


@pytest.fixture(scope="module")
def programs() -> dict[str, Any]:
    ep = torch.export.export(Silu(), (X,))
    edge = to_edge(torch.export.export(Silu(), (X,)))
    et = to_edge(torch.export.export(Silu(), (X,))).to_executorch()
    return {"exported": ep, "edge": edge, "edge_ep": edge.exported_program(), "executorch": et}


@pytest.mark.parametrize("kind", ["exported", "edge", "edge_ep", "executorch"])
def test_find_matches_and_why_not_take_every_program_type(programs: dict[str, Any],
                                                          kind: str) -> None:
    program = programs[kind]
    inner = as_exported_program(program)
    rule = _silu_rule()
    ms = find_matches(program, [rule])
    assert _shape(ms) == _shape(find_matches(inner, [rule]))
    mul = next(n for n in inner.graph.nodes if n.op == "call_function"
               and "sigmoid" in str([op_key(a.target) for a in n.all_input_nodes]))
    verdict = why_not(program, rule, mul.name)
    assert verdict.root is mul
    if kind == "executorch":  # out variants: the rule (on aten.mul.Tensor) is not rooted there
        assert ms.accepted == [] and verdict.status == "not_root"
    else:
        assert [m.root for m in ms.accepted] == [mul] and verdict.status == "fused"


def test_fusion_pass_applies_to_an_edge_program_manager_in_place() -> None:
    edge = to_edge(torch.export.export(Silu(), (X,)))
    fusion = FusionPass([_silu_rule()])
    result = fusion(edge)
    assert result.modified and fusion.report.rules["silu_as_relu_sigmoid"].fused == 1
    keys = [op_key(n.target) for n in edge.exported_program().graph.nodes
            if n.op == "call_function"]
    assert "aten.sigmoid.default" not in keys  # the manager's own program changed
    (got,) = run_pte(bytes(edge.to_executorch().buffer), (X,))
    torch.testing.assert_close(got, torch.relu(X * X) + 1.0)


def test_fusion_pass_refuses_a_serialized_program_and_says_when_to_run(
        programs: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=r"FusionPass changes the program.*before \.to_executorch"):
        FusionPass([_silu_rule()])(programs["executorch"])


@pytest.mark.parametrize("thing, hint", [
    (Silu(), "export it first"),
    (torch.fx.symbolic_trace(Silu()), "graph module alone has no signature"),
    ("model.pt2", "load it first"),
    (None, ""),
])
def test_anything_else_is_a_type_error_naming_it(thing: Any, hint: str) -> None:
    for call in (lambda: find_matches(thing, [_silu_rule()]),
                 lambda: why_not(thing, _silu_rule(), "mul"),
                 lambda: FusionPass([_silu_rule()])(thing),
                 lambda: explain(thing, "xnnpack")):
        with pytest.raises(TypeError) as info:
            call()
        message = str(info.value)
        assert "an ExportedProgram, an EdgeProgramManager or an ExecutorchProgramManager" in message
        assert type(thing).__qualname__ in message and hint in message


def test_a_manager_without_the_method_names_the_ones_it_has(programs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"no method 'decode' \(methods: forward\)"):
        as_exported_program(programs["edge"], "decode")


@pytest.mark.parametrize("kind", ["exported", "edge", "edge_ep", "executorch"])
def test_app_explain_takes_every_program_type(programs: dict[str, Any], kind: str) -> None:
    program = programs[kind]
    edge = edge_program(program)
    assert edge.dialect == "EDGE"
    if kind == "exported":
        assert edge is not program and program.dialect != "EDGE"  # to_edge of a copy
    else:
        assert edge is as_exported_program(program)
    ms = explain(program, "xnnpack", [_silu_rule()])
    assert [m.rule.name for m in ms.accepted] == ([] if kind == "executorch"
                                                  else ["silu_as_relu_sigmoid"])


@pytest.mark.parametrize("kind", ["exported", "edge", "edge_ep"])
def test_app_lower_takes_an_exported_or_edge_program_and_the_pte_runs(kind: str) -> None:
    fresh = {"exported": lambda: torch.export.export(Silu(), (X,)),
             "edge": lambda: to_edge(torch.export.export(Silu(), (X,))),
             "edge_ep": lambda: to_edge(torch.export.export(Silu(), (X,))).exported_program()}
    result = lower(fresh[kind](), "xnnpack", [_silu_rule()])
    assert result.report.rules["silu_as_relu_sigmoid"].fused == 1
    (got,) = run_pte(result.pte, (X,))
    torch.testing.assert_close(got, torch.relu(X * X) + 1.0)


def test_app_lower_refuses_a_serialized_program(programs: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="already serialized"):
        lower(programs["executorch"], "xnnpack")


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


@pytest.fixture(scope="module")
def vulkan() -> dict[str, Any]:
    torch.manual_seed(0)
    model = Linear().eval()
    result = lower(torch.export.export(model, (X,)), "vulkan")
    assert isinstance(result.edge, EdgeProgramManager)
    assert isinstance(result.program, ExecutorchProgramManager)
    return {"model": model, "edge": result.edge, "edge_ep": result.edge.exported_program(),
            "executorch": result.program}


def test_vulkan_check_and_simulate_take_every_program_type(vulkan: dict[str, Any]) -> None:
    from fusionkit.backends.vulkan_adapter import check, simulate
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates

    counts = {k: len(vulkan_delegates(vulkan[k])) for k in ("edge", "edge_ep", "executorch")}
    assert set(counts.values()) == {1}, counts
    want = vulkan["model"](X)
    for kind in ("edge", "edge_ep", "executorch"):
        assert check(vulkan[kind]) == [], kind
        got = simulate(vulkan[kind], X)
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(TypeError, match=r"not test_entry_points\.Linear; export it first"):
        simulate(vulkan["model"], X)


def test_simulate_model_takes_a_lowered_program(vulkan: dict[str, Any]) -> None:
    from fusionkit.app.simulate_job import simulate_model

    for kind in ("edge", "executorch"):
        report = simulate_model(vulkan[kind], vulkan["model"], (X,))
        assert report.ok and report.error is None, (kind, report.error)
        assert [sum(d.ops.values()) > 0 for d in report.delegates] == [True]
    with pytest.raises(ValueError, match="needs the eager module"):
        simulate_model(vulkan["edge"], None, (X,))


def test_why_not_at_an_unknown_node_suggests_the_closest_names(programs: dict[str, Any]) -> None:
    with pytest.raises(KeyError, match=r"no node named 'aten_sigmoid_defalt'.*did you mean "
                                       r"aten_sigmoid_default"):
        why_not(programs["edge"], _silu_rule(), "aten_sigmoid_defalt")
