"""Gates specialized to a graph's op keys give the same verdict as the generic gates.

:func:`fusionkit.match.gates.specialize` intersects every key set of a gate with the op
keys present in the graph searched; the finder uses the specialized gates. The
verdict at every node must not change — checked here for every shipped rule at
every op node of real graphs, with the graph's own keys and with generated
supersets of them — and :func:`graph_op_keys` must report exactly the graph's keys,
also after the graph is edited.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import export_edge
from rmsnorm_models import D
from test_finder_gate import _CastsBeforeANearMiss
from test_matcher_reference import _corpus, _shipped_rules
from torch.export import ExportedProgram

from fusionkit import RuleIndex
from fusionkit.match.gates import Gate, gate_of, graph_op_keys, specialize
from fusionkit.targets import op_key


@pytest.fixture(scope="module")
def graphs() -> dict[str, ExportedProgram]:
    from benchmarks import graphs as bench_graphs

    out = _corpus()
    out["bench_mixed"] = bench_graphs.build("mixed", 2)
    # a normed product behind casts, with no rsqrt: only the pass-through guard lets it by
    out["casts_near_miss"] = export_edge(_CastsBeforeANearMiss(),
                                         (torch.randn(2, D, dtype=torch.float16),))
    return out


def _scan(graph: torch.fx.Graph) -> frozenset[str]:
    keys = {op_key(n.target) for n in graph.nodes if n.op == "call_function"}
    return frozenset(k for k in keys if k is not None)


def _gates() -> list[tuple[str, Any]]:
    index = RuleIndex(_shipped_rules())
    return [(r.name, g) for r in index.rules if (g := index.gate(r)) is not None]


def _verdicts(gate: Any, ep: ExportedProgram) -> list[bool]:
    # at the root the finder runs only the operands' check (the node has the root's op)
    check = gate.operands_check if isinstance(gate, Gate) else gate.check
    return [check(n) for n in ep.graph_module.graph.nodes
            if n.op == "call_function" and op_key(n.target) in gate.targets]


def test_graph_op_keys_are_the_graphs_keys_also_after_edits(
        graphs: dict[str, ExportedProgram]) -> None:
    ep = graphs["casts"]
    gm = torch.fx.GraphModule(ep.graph_module, __import__("copy").deepcopy(ep.graph))
    graph = gm.graph
    assert graph_op_keys(graph) == _scan(graph)
    relu = next(n for n in graph.nodes if "relu" in str(n.target))
    relu.replace_all_uses_with(relu.args[0])
    graph.erase_node(relu)  # the only relu: its key must go
    assert "aten.relu.default" not in graph_op_keys(graph)
    assert graph_op_keys(graph) == _scan(graph)
    mul = next(n for n in graph.nodes if "mul" in str(n.target))
    with graph.inserting_after(mul):
        graph.call_function(torch.ops.aten.sigmoid.default, (mul,))
    mul.target = torch.ops.aten.div.Tensor  # retargeted in place
    assert graph_op_keys(graph) == _scan(graph)
    assert {"aten.sigmoid.default", "aten.div.Tensor"} <= graph_op_keys(graph)
    # without FX's side table (another torch), the keys come from a scan
    table = graph.__dict__.pop("_find_nodes_lookup_table")
    try:
        assert graph_op_keys(graph) == _scan(graph)
    finally:
        graph._find_nodes_lookup_table = table


def test_specialized_gates_give_the_same_verdicts(graphs: dict[str, ExportedProgram]) -> None:
    compared = passed = emptied = 0
    for name, ep in graphs.items():
        present = graph_op_keys(ep.graph_module.graph)
        for rule, gate in _gates():
            special = specialize(gate, present)
            verdicts = _verdicts(gate, ep)
            assert _verdicts(special, ep) == verdicts, f"{rule} on {name}"
            compared += len(verdicts)
            passed += sum(verdicts)
            emptied += isinstance(special, Gate) and not special.keys
    # real nodes, both verdicts, and gates reduced to their cheap form
    assert compared > 300 and 0 < passed < compared and emptied > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_specialized_to_more_keys_gives_the_same_verdicts(graphs: dict[str, ExportedProgram],
                                                          data: Any) -> None:
    """A graph's keys plus any keys the gates mention: some levels keep a few keys."""
    gates = _gates()
    mentioned = sorted({k for _, g in gates for k in _keys_of(g)})
    name = data.draw(st.sampled_from(sorted(graphs)))
    ep = graphs[name]
    extra = data.draw(st.sets(st.sampled_from(mentioned), max_size=12))
    present = graph_op_keys(ep.graph_module.graph) | frozenset(extra)
    for rule, gate in gates:
        assert _verdicts(specialize(gate, present), ep) == _verdicts(gate, ep), rule


def _keys_of(g: Any) -> set[str]:
    from fusionkit.match.gates import _all_keys

    return set(_all_keys(g))


def test_a_quantized_rule_costs_a_length_check_on_a_float_graph(
        graphs: dict[str, ExportedProgram]) -> None:
    from fusionkit.passes.vulkan.quantized_linear import q4gsw_linear_rule

    rule = q4gsw_linear_rule()
    gate = gate_of(rule.pattern, 2)
    assert gate is not None
    present = graph_op_keys(graphs["hf"].graph_module.graph)
    special = specialize(gate, present)
    # no dequantize in a float graph: every option's operand check is the length test
    options = getattr(special, "options", (special,))
    assert options and all(isinstance(o, Gate) and not o.keys and not o.free for o in options)
    assert specialize(gate, present) is special  # remembered per gate and relevant keys
