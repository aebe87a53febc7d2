"""A partition's runtime assertions go with the symbol they bound
(``fusionkit.integration.runtime_assertions``).

A graph split into two Vulkan partitions by an op kept on the CPU: ExecuTorch's
partitioner puts the ``.item()``'s assertions in one partition and the ``narrow`` that
reads the value in the other, and Vulkan's preprocess re-trace then cannot tell that the
start is not negative (stock ExecuTorch 1.5.1 fails to lower this program). Under the
adapter the assertions move to the partition computing the value; the program lowers
and computes what eager computes.
"""

from __future__ import annotations

from typing import Any

import torch
from split_narrow import INPUTS, SplitNarrow
from vulkan_real_programs import lower, run_all

from fusionkit.integration.runtime_assertions import (
    ASSERTION_TARGETS,
    keep_assertions_with_symbols,
)


def _export() -> Any:
    """A fresh export per lowering (a program with unbacked symbols is lowered once)."""
    return torch.export.export(SplitNarrow().eval(), INPUTS, strict=False)


def _edge_graph() -> torch.fx.GraphModule:
    """A fresh edge graph (an exported program with unbacked symbols goes to edge once)."""
    from executorch.exir import to_edge

    gm: torch.fx.GraphModule = to_edge(_export()).exported_program().graph_module
    return gm


def _tag(gm: torch.fx.GraphModule, item_tag: str, assertion_tag: str) -> list[torch.fx.Node]:
    """The value's own nodes (``select``, ``.item()``, the slice) in ``item_tag``, the
    assertions (and their comparisons) in ``assertion_tag``, the rest untagged."""
    asserts = [n for n in gm.graph.nodes if n.target in ASSERTION_TARGETS]
    for n in gm.graph.nodes:
        name = str(n.target)
        if n.op != "call_function":
            continue
        if n in asserts or "ge" == getattr(n.target, "__name__", "") or name.startswith(
                "<built-in function l"):
            n.meta["delegation_tag"] = assertion_tag
        elif any(s in name for s in ("select", "_local_scalar_dense", "slice", "sym_size",
                                     "operator.add", "built-in function add")):
            n.meta["delegation_tag"] = item_tag
    return asserts


def test_assertions_move_to_the_partition_computing_their_symbol() -> None:
    gm = _edge_graph()
    asserts = _tag(gm, "tag_item", "tag_other")
    assert asserts, "torch.export kept no assertion for the .item()"
    moved = keep_assertions_with_symbols(gm, {"tag_item", "tag_other"})
    assert {(frm, to) for _, frm, to in moved} == {("tag_other", "tag_item")}
    assert {a.meta["delegation_tag"] for a in asserts} == {"tag_item"}
    # each predicate went with it: no delegated node of the other partition reads the value
    item = next(n for n in gm.graph.nodes if "_local_scalar_dense" in str(n.target))
    assert all(u.meta.get("delegation_tag") == "tag_item" for u in item.users)


def test_an_assertion_stays_where_no_partition_has_what_it_reads() -> None:
    """Only one of the two partitions is delegated: the value's own is not, so there is no
    partition to move into (moving would add an edge out of the CPU program)."""
    gm = _edge_graph()
    asserts = _tag(gm, "tag_item", "tag_other")
    assert keep_assertions_with_symbols(gm, {"tag_other"}) == []
    assert {a.meta["delegation_tag"] for a in asserts} == {"tag_other"}


def test_stock_fails_the_split_program_and_the_adapter_lowers_it() -> None:
    """Stock ExecuTorch's lowering fails in Vulkan's preprocess re-trace (the
    ``GuardOnDataDependentSymNode`` of ``export_llm``'s llama with expanded rope tables);
    under ``install()`` with ExecuTorch's own partitioner, and with the adapter's, the
    program lowers, ``check()`` finds nothing and the simulator computes eager's values."""
    eager = SplitNarrow().eval()(*INPUTS)
    stock = lower("split_narrow", "assertions", "stock", _export(), INPUTS, eager)
    if stock.lower_error is not None:  # an ExecuTorch that places them itself may lower it
        assert "data-dependent" in stock.lower_error or "GuardOnDataDependent" in stock.lower_error, \
            stock.lower_error
    for path in ("installed", "adapter"):
        ours = lower("split_narrow", "assertions", path, _export(), INPUTS, eager)
        assert ours.lower_error is None, (path, ours.lower_error)
        assert ours.check_problems == [], (path, ours.check_problems)
        assert ours.simulator == "ok", (path, ours.simulator)


def test_the_split_program_runs_on_the_real_runtime(vulkan_runtime: Any) -> None:
    eager = SplitNarrow().eval()(*INPUTS)
    ours = lower("split_narrow", "assertions", "installed", _export(), INPUTS, eager)
    run_all([ours])
    assert ours.outcome == "ok", ours.describe()
