"""A partition that gives the rest of the program ints only runs on the CPU
(``vulkan_adapter.int_only_partitions``): ExecuTorch cannot lower such a delegate.

The pipelines it unblocks (``export_llm`` on Vulkan without ``use_sdpa_with_kv_cache``,
with ``quantize_kv_cache``) are in ``test_pipeline_export_llm.py``; the position-mask
program, lowered by the adapter and under install, in
``test_vulkan_scalar_and_blit_conditions.py``.
"""

from __future__ import annotations

import torch
from test_vulkan_scalar_and_blit_conditions import MASK_X, PositionMask

from fusionkit.backends.vulkan_adapter.int_only_partitions import (
    int_only_partitions,
    leave_int_only_partitions,
)
from fusionkit.integration.partition_tags import untag


def _edge_graph() -> torch.fx.GraphModule:
    from executorch.exir import to_edge

    ep = torch.export.export(PositionMask(), (MASK_X, torch.tensor([0])), strict=False)
    gm: torch.fx.GraphModule = to_edge(ep).exported_program().graph_module
    return gm


def _tag(gm: torch.fx.GraphModule, by_op: dict[str, str]) -> None:
    for n in gm.graph.nodes:
        if n.op == "call_function":
            tag = next((t for op, t in by_op.items() if op in str(n.target)), None)
            if tag is not None:
                n.meta["delegation_tag"] = tag


def test_only_the_partition_giving_ints_only_is_found_and_untagged() -> None:
    gm = _edge_graph()
    _tag(gm, {"select": "ints", "_local_scalar_dense": "ints", "aten.add": "tensor"})
    tags = {"ints": None, "tensor": None}
    found = int_only_partitions(gm, tags)
    assert list(found) == ["ints"]
    assert any("_local_scalar_dense" in n for n in found["ints"]), found
    untag(gm, tags, found)
    assert list(tags) == ["tensor"]
    assert {n.meta.get("delegation_tag") for n in gm.graph.nodes} == {None, "tensor"}


def test_a_partition_giving_a_tensor_too_stays() -> None:
    """The int and the mask it makes in one partition: a tensor leaves it."""
    gm = _edge_graph()
    _tag(gm, {"select": "p", "_local_scalar_dense": "p", "arange": "p", "lt": "p",
              "_to_copy": "p", "to_dim_order_copy": "p"})
    assert int_only_partitions(gm, {"p": None}) == {}


def test_leaving_them_gives_each_node_its_int_only_fact() -> None:
    """What both reporters use: the adapter's kept_off_nodes and the install event."""
    gm = _edge_graph()
    _tag(gm, {"select": "ints", "_local_scalar_dense": "ints", "aten.add": "tensor"})
    tags = {"ints": None, "tensor": None}
    names = int_only_partitions(gm, tags)["ints"]
    [left] = leave_int_only_partitions(gm, tags)
    assert [k.node for k in left] == names
    assert {k.fact for k in left} == {"int_only"}
    assert all(k.op in k.reason for k in left) and "ints only" in left[0].reason
    assert list(tags) == ["tensor"]
    assert leave_int_only_partitions(gm, tags) == []
