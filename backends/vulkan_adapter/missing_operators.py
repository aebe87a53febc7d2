"""Operators the Vulkan runtime lacks run on the CPU: ExecuTorch's own partitioner too.

ExecuTorch 1.5.1's ``VulkanPartitioner`` delegates every op its Python registry lists,
among them ops no ``VK_REGISTER_OP`` of the runtime names (``aten.logical_not.default``:
the attention mask of ``export_llm``'s llama without KV cache): the runtime aborts at load
(``Missing operator``), for the whole program. The adapter's partitioner blocklists such
ops when it is built; :func:`partition_keeping_missing_operators_off` gives ExecuTorch's
own partitioner the same blocklist for each ``partition()`` under :func:`~.install.install`
(``fusionkit exec``), so a pipeline that builds the stock partitioner gets a program that
loads. Only ops the runtime lacks everywhere are kept off, each one only where the CPU
runtime has a kernel and no Vulkan preprocess removes it: a program this changes is one
the runtime could not load.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from fusionkit import events

from .runtime_support import cpu_has_kernel, pattern_ops

__all__ = ["KEPT_OFF", "missing_operator_blocklist", "partition_keeping_missing_operators_off",
           "preprocess_pattern_ops"]

_LOG = logging.getLogger(__name__)

#: op name -> why, for every op a stock partitioner kept off under install (the exec report's
#: and a test's record; the partitioner's own ``operator_blocklist`` is put back after)
KEPT_OFF: dict[str, str] = {}


@functools.cache
def preprocess_pattern_ops() -> frozenset[str]:
    """Every op a preprocess rule's pattern matches (the ops a preprocess fusion may remove)."""
    from .preprocess_rules import TAKEN_OVER_PASSES, rules_for

    return frozenset().union(*(pattern_ops(r.pattern)
                               for p in TAKEN_OVER_PASSES for r in rules_for(p)))


def missing_operator_blocklist(runtime: Any = "auto") -> tuple[Any, dict[Any, str]]:
    """The runtime's inventory and, for each op the partitioner's registry supports that
    this runtime lacks, the CPU runtime runs and no preprocess removes: op -> why.

    ``runtime``: a :class:`~.runtime_probe.RuntimeInventory`; "auto": the probed runtime's
    when it was already probed; ``None`` (or no probe): what the installed wheel implies
    (:func:`~.wheel_inventory.wheel_inventory`; a probe only adds facts)."""
    from executorch.backends.vulkan._passes.remove_redundant_ops import (
        RemoveRedundantOpsTransform,
    )
    from executorch.backends.vulkan.op_registry import vulkan_supported_ops

    from .wheel_inventory import wheel_inventory

    if isinstance(runtime, str):
        from .runtime_probe import cached_inventory

        runtime = cached_inventory()
    if runtime is None:
        runtime = wheel_inventory()
    removed = RemoveRedundantOpsTransform.redundant_ops
    consumed = preprocess_pattern_ops()
    blocked: dict[Any, str] = {}
    for op in vulkan_supported_ops:
        name = getattr(op, "__name__", "")
        if (runtime.has_operator(name) or op in removed or name in consumed
                or not cpu_has_kernel(name)):
            continue
        blocked[op] = f"{runtime.named()} has no {name}: it runs on the CPU"
    return runtime, blocked


def partition_keeping_missing_operators_off(stock_partition: Callable[..., Any]
                                            ) -> Callable[..., Any]:
    """``VulkanPartitioner.partition`` with :func:`missing_operator_blocklist` added to the
    partitioner's ``operator_blocklist`` for this call. The adapter's own partitioner
    (``fusionkit_adapter`` set) keeps the runtime it was built for: left as it is."""

    @functools.wraps(stock_partition)
    def partition(self: Any, exported_program: Any) -> Any:
        blocklist = getattr(self, "operator_blocklist", None)
        if getattr(self, "fusionkit_adapter", None) is not None or not isinstance(blocklist,
                                                                                 set):
            return stock_partition(self, exported_program)
        _, blocked = missing_operator_blocklist()
        added = {op: why for op, why in blocked.items() if op not in blocklist}
        blocklist.update(added)
        try:
            result = stock_partition(self, exported_program)
        finally:
            blocklist.difference_update(added)
        on_cpu = _undelegated_targets(result)
        kept = {getattr(op, "__name__", str(op)): why for op, why in added.items()
                if op in on_cpu}
        for name, why in kept.items():
            _LOG.info("fusionkit: %s", why)
            events.placed("vulkan", f"kept on the CPU: {name}", why)
        KEPT_OFF.update(kept)
        return result

    return partition


def _undelegated_targets(result: Any) -> set[Any]:
    """The ops of the nodes the partition left on the CPU."""
    return {n.target for n in result.tagged_exported_program.graph_module.graph.nodes
            if n.op == "call_function" and n.meta.get("delegation_tag") not in result.partition_tags}
