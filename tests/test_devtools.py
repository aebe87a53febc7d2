"""ExecuTorch's devtools see fusionkit's fusions: debug handles, ETRecord, Inspector.

A fused node carries the root's int ``debug_handle`` (what ExecuTorch accepts in a
node), ``from_node`` naming every replaced node (root last) and the replaced nodes'
handles; ``attribute_fusions`` puts those into the ETRecord's handle maps, so
``Inspector.calculate_numeric_gap`` attributes a fused op's runtime value to all the
nodes it replaced. Run for real: the portable runtime and XNNPACK (``portable_lib``,
with an ETDump and a debug buffer).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fusionkit import FusionPass, Rule, capture, op, ref, replace_with
from fusionkit.edit.builder import DEBUG_HANDLES_KEY
from fusionkit.integration.devtools import attribute_fusions, expand_handles, fused_debug_handles

REPO = Path(__file__).resolve().parent.parent
DEMO = "fusionkit.app.demo_model:demo_factory"

x, y = capture("x"), capture("y")
#: right: ``x * (1 / y)`` is ``x / y``
RECIP_MUL = Rule(name="recip_mul",
                 pattern=op("aten.mul.Tensor", x, op("aten.reciprocal.default", y)),
                 replacement=replace_with("aten.div.Tensor", ref("x"), ref("y")))
#: planted wrong: ``x * sigmoid(x)`` (SiLU) is not GELU
SILU_AS_GELU = Rule(name="silu_as_gelu",
                    pattern=op("aten.mul.Tensor", x, op("aten.sigmoid.default", x)),
                    replacement=replace_with("aten.gelu.default", ref("x")))


class Tiny(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = (a + 1.0) * torch.reciprocal(b)
        return torch.tanh(c * torch.sigmoid(c))


INPUTS = (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),
          torch.rand(4, 8, generator=torch.Generator().manual_seed(1)) + 0.5)


def _edge(rules: list[Rule], partitioner: Any = None) -> Any:
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(Tiny(), INPUTS)
    return to_edge_transform_and_lower(ep, transform_passes=[FusionPass(rules)],
                                       partitioner=partitioner, generate_etrecord=True)


def _inspect(program: Any, record: Any, tmp: Path) -> Any:
    """Run ``program`` on ``portable_lib`` with an ETDump and a debug buffer; the
    Inspector's MSE table (aot_ops, runtime_ops, gap), in program order."""
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    record.update_representative_inputs([INPUTS])
    record.save(str(tmp / "etrecord.bin"))
    module = _load_for_executorch_from_buffer(program.buffer, enable_etdump=True,
                                              debug_buffer_size=1 << 20)
    module.forward(INPUTS)
    module.write_etdump_result_to_file(str(tmp / "etdump.etdp"), str(tmp / "debug.bin"))
    inspector = Inspector(etdump_path=str(tmp / "etdump.etdp"),
                          etrecord=str(tmp / "etrecord.bin"),
                          debug_buffer_path=str(tmp / "debug.bin"))
    df = inspector.calculate_numeric_gap("MSE")
    return [(list(r.aot_ops), list(r.runtime_ops), float(r.gap[0])) for r in df.itertuples()]


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny model with both rules, no delegate: one instruction per op."""
    edge = _edge([RECIP_MUL, SILU_AS_GELU])
    program = edge.to_executorch()
    plain = _inspect(program, program.get_etrecord(), tmp_path_factory.mktemp("plain"))
    record = program.get_etrecord()
    expansions = attribute_fusions(record)
    rows = _inspect(program, record, tmp_path_factory.mktemp("attributed"))
    return {"edge": edge, "expansions": expansions, "rows": rows, "plain": plain}


def _node(ep: Any, name: str) -> Any:
    return next(n for n in ep.graph.nodes if n.name == name)


def test_a_fused_node_keeps_the_handles_of_what_it_replaced(portable: dict[str, Any]) -> None:
    from executorch.exir.debug_handle_utils import get_greatest_ancestor_node_identifier

    before = portable["edge"]._etrecord.edge_dialect_program  # edge, before the rules
    after = portable["edge"]._etrecord.graph_map["edge_after_transform/forward"]
    recip, mul = _node(before, "aten_reciprocal_default"), _node(before, "aten_mul_tensor")
    div = next(n for n in after.graph.nodes if n.meta.get("fusionkit_rule") == "recip_mul")
    # the root's int handle (ExecuTorch takes only an int in a node), every replaced
    # node's handle (root last), every replaced node as provenance (root last)
    assert div.meta["debug_handle"] == mul.meta["debug_handle"]
    assert div.meta[DEBUG_HANDLES_KEY] == (recip.meta["debug_handle"], mul.meta["debug_handle"])
    assert [s.name for s in div.meta["from_node"]] == [recip.name, mul.name]
    # ExecuTorch's own ancestry (DebugHandleGeneratorPass) leads to the root's ancestor
    assert (get_greatest_ancestor_node_identifier(div)
            == get_greatest_ancestor_node_identifier(mul))
    expansions = portable["expansions"]  # both fusions: two ops from two each
    assert len(expansions) == 2 and all(len(h) == 2 for h in expansions.values())
    assert expansions[mul.meta["debug_handle"]] == div.meta[DEBUG_HANDLES_KEY]


def test_the_inspector_attributes_a_fused_op_to_the_nodes_it_replaced(
        portable: dict[str, Any]) -> None:
    rows = portable["rows"]
    by_op = {tuple(aot): (runtime, gap) for aot, runtime, gap in rows}
    assert by_op[("reciprocal", "mul")][0] == ["native_call_div.out"]
    assert by_op[("reciprocal", "mul")][1] < 1e-12        # the right rule
    assert by_op[("sigmoid", "mul_1")][0] == ["native_call_gelu.out"]
    assert by_op[("sigmoid", "mul_1")][1] > 1e-3          # the planted wrong rule
    # the first op that differs, in program order, is the wrong fusion, named by the
    # nodes it replaced (what follows it differs because its input does)
    first = next(aot for aot, _, gap in rows if gap > 1e-9)
    assert first == ["sigmoid", "mul_1"]
    # without attribute_fusions the fused op is compared with the same op, named alone
    assert sorted(tuple(aot) for aot, _, _ in portable["plain"]) == [
        ("add",), ("mul",), ("mul_1",), ("tanh",)]


def test_expanding_keeps_the_last_handle_last() -> None:
    exp = {3: (2, 3), 5: (4, 5)}
    assert expand_handles(3, exp) == [2, 3]
    assert expand_handles(7, exp) == 7
    assert expand_handles([1, 3, 5], exp) == [1, 2, 3, 4, 5]
    assert expand_handles((5, 4), exp) == (5, 4)  # a tuple stays one; 4 ends where it was


def test_a_handle_another_node_still_carries_is_not_claimed() -> None:
    g = torch.fx.Graph()
    a = g.placeholder("a")
    fused = g.call_function(torch.ops.aten.relu.default, (a,))
    fused.meta.update(debug_handle=3, **{DEBUG_HANDLES_KEY: (1, 2, 3)})
    other = g.call_function(torch.ops.aten.neg.default, (fused,))
    other.meta["debug_handle"] = 2  # an op sharing a handle with a fused-away one
    g.output(other)
    assert fused_debug_handles(torch.fx.GraphModule(torch.nn.Module(), g)) == {3: (1, 3)}


@pytest.fixture(scope="module")
def xnnpack(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same through fusionkit's XNNPACK lowering (the rules as ``--spec`` rules run:
    before partitioning), run on XNNPACK."""
    from fusionkit.app.lowering import lower

    ep = torch.export.export(Tiny(), INPUTS)
    result = lower(ep, "xnnpack", [RECIP_MUL], etrecord=True)
    rows = _inspect(result.program, result.etrecord, tmp_path_factory.mktemp("xnnpack"))
    return {"result": result, "rows": rows}


def test_xnnpack_delegate_names_the_fused_ops_replaced_nodes(xnnpack: dict[str, Any]) -> None:
    rows = xnnpack["rows"]
    delegated = [(aot, gap) for aot, runtime, gap in rows if "DELEGATE_CALL" in runtime]
    assert delegated, rows
    names = {n for aot, _ in delegated for n in aot}
    assert {"reciprocal", "mul"} <= names  # the fused-away reciprocal is named too
    assert all(gap < 1e-9 for _, gap in delegated)
    record = xnnpack["result"].etrecord
    assert record.graph_map and "edge_after_transform/forward" in record.graph_map


def test_lower_writes_an_etrecord_the_inspector_reads(tmp_path: Path) -> None:
    """``fusionkit lower --etrecord``: the demo model for Vulkan (RMSNorm fused before
    partitioning); the parsed ETRecord holds the graphs before and after the rules, and
    its delegate's handle list names the nodes each fused RMSNorm replaced."""
    from executorch.backends.vulkan import custom_ops_lib  # noqa: F401 - et_vk ops, to parse
    from executorch.devtools.etrecord import parse_etrecord

    rec_path, pte = tmp_path / "demo.etrecord", tmp_path / "demo.pte"
    run = subprocess.run([sys.executable, "-m", "fusionkit.app.cli", "lower", DEMO,
                          "--backend", "vulkan", "-o", str(pte), "--etrecord", str(rec_path)],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"wrote {rec_path}" in run.stdout
    record = parse_etrecord(str(rec_path))
    before, after = record.edge_dialect_program, record.graph_map["edge_after_transform/forward"]
    assert record.exported_program is not None and record._representative_inputs
    handle = {n.name: n.meta.get("debug_handle") for n in before.graph.nodes}
    fused = [n for n in after.graph.nodes if "rms_norm" in str(n.target)]
    assert fused
    listed = {h for per in record._debug_handle_map.values() for v in per.values()
              for h in (v if isinstance(v, list) else [v])}
    for n in fused:
        replaced = [handle[s.name] for s in n.meta["from_node"]]
        assert len(replaced) > 3 and set(replaced) <= listed, (n.name, replaced)
    # Vulkan's per-op map holds node positions (its graph builder overwrites the handles
    # with them), not handles: left as it is, one number per op
    (per,) = record._delegate_map.values()
    assert all(meta["name"] == "VulkanBackend" for meta in per.values())
    assert all(len(v) == 1 for meta in per.values() for v in meta["delegate_map"].values())
