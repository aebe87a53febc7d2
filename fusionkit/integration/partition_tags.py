"""Leave partitions to the CPU after a partitioner tagged them.

A partitioner marks each node it delegates with ``meta["delegation_tag"]`` and lists the
tag in ``PartitionResult.partition_tags``; ``to_backend`` lowers what both say. A step
that decides afterwards that some partitions must run on the CPU (one left empty, one
whose results the backend cannot hand back) removes both marks, or the lowering would
see a tag with no nodes or nodes with no tag.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.fx import GraphModule

__all__ = ["empty_partitions", "untag"]


def untag(graph_module: GraphModule, partition_tags: dict[str, Any], tags: Iterable[str]
          ) -> None:
    """Leave partitions ``tags`` to the CPU: their nodes untagged, the tags dropped."""
    tags = set(tags)
    for n in graph_module.graph.nodes:
        if n.meta.get("delegation_tag") in tags:
            del n.meta["delegation_tag"]
    for tag in tags:
        del partition_tags[tag]


def empty_partitions(graph_module: GraphModule, partition_tags: dict[str, Any]) -> set[str]:
    """The tags no call node carries any more."""
    used = {n.meta.get("delegation_tag") for n in graph_module.graph.nodes
            if n.op == "call_function"}
    return {t for t in partition_tags if t not in used}
