"""Partitions that give the rest of the program ints only are left to the CPU.

A Vulkan partition whose results are all ints (an ``.item()``, a size) cannot be lowered:
Vulkan's preprocess memory planning asserts on a graph with no tensor output
(``graph_output_allocated not set``), and ExecuTorch's ``_unsafe_adjust_original_program``
refuses a lone SymInt result ("Invalid user ..."). Such partitions appear when the nodes
reading the int run on the CPU: ``export_llm``'s ``model.quantize_kv_cache`` (the quantized
cache's updates stay with the CPU program) leaves ``input_pos[0].item()`` alone in its
partition, and a comparison kept off (:mod:`.broken_conditions`) leaves the position it
reads. The CPU computes such ints as well. The adapter's partitioner untags them itself
(fact ``int_only``); :func:`partition_without_int_only` does it for ExecuTorch's own
partitioner under :func:`~.install.install`, after every other step of the chain has
placed its nodes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from torch.fx import Node

from fusionkit import events

from .runtime_support import KeptOff, keep_partitions_off

__all__ = ["int_only_partitions", "leave_int_only_partitions", "partition_without_int_only"]

_LOG = logging.getLogger(__name__)


def int_only_partitions(graph_module: Any, partition_tags: Any) -> dict[str, list[str]]:
    """Tag -> the names of its call nodes, for each partition of ``partition_tags`` whose
    results (the values a node outside it reads) are all ints."""
    import torch

    by_tag: dict[str, list[Node]] = {}
    for n in graph_module.graph.nodes:
        tag = n.meta.get("delegation_tag")
        if tag in partition_tags and n.op == "call_function":
            by_tag.setdefault(tag, []).append(n)
    out: dict[str, list[str]] = {}
    for tag, nodes in by_tag.items():
        results = [n for n in nodes if any(u.meta.get("delegation_tag") != tag for u in n.users)]
        if results and not any(isinstance(n.meta.get("val"), torch.Tensor) for n in results):
            out[tag] = [n.name for n in nodes]
    return out


def leave_int_only_partitions(graph_module: Any, partition_tags: Any) -> list[list[KeptOff]]:
    """Untag every int-only partition (:func:`int_only_partitions`); per partition, its
    nodes as :class:`~.runtime_support.KeptOff` facts (``int_only``), one reason each."""
    return keep_partitions_off(
        graph_module, partition_tags, int_only_partitions(graph_module, partition_tags),
        "int_only",
        lambda what: (f"its partition ({what}) gives the CPU ints only, a delegate ExecuTorch "
                      "cannot lower (no tensor result): it runs on the CPU"))


def partition_without_int_only(stock_partition: Callable[..., Any]) -> Callable[..., Any]:
    """``VulkanPartitioner.partition`` that leaves int-only partitions to the CPU. The
    adapter's own partitioner (which does so itself, noting each node) is left as it is."""

    @functools.wraps(stock_partition)
    def partition(self: Any, exported_program: Any) -> Any:
        result = stock_partition(self, exported_program)
        if getattr(self, "fusionkit_adapter", None) is not None:
            return result
        gm = result.tagged_exported_program.graph_module
        for partition_nodes in leave_int_only_partitions(gm, result.partition_tags):
            why = partition_nodes[0].reason
            _LOG.info("fusionkit: %s", why)
            events.placed("vulkan", "partition kept on the CPU: ints only", why)
        return result

    return partition
