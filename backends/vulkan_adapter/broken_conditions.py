"""A node the runtime would abort on or miscompute runs on the CPU: ExecuTorch's partitioner too.

ExecuTorch 1.5.1's ``VulkanPartitioner`` delegates a node when its Python registry lists
the op, whatever its arguments; the runtime checks some of them only when it builds the
graph, and reads some once, then. ``export_llm``'s local/global attention
(``model.local_global_attention``) delegates three such nodes: ``llama.custom_sdpa`` with
a mask, which ``SDPA.cpp: sdpa_impl`` refuses (the program aborts at its first call); a
``_to_copy`` that keeps its stored dtype, a texture-only ``BlitNode`` given buffers
(abort); and ``arange(n) < start_pos``, whose position ``BinaryScalarOp.cpp`` reads at the
first call only (garbage from the second). The adapter's partitioner keeps such nodes off
already (:class:`~.runtime_support.RuntimeSupport`, fact ``runtime_condition``);
:func:`partition_keeping_broken_conditions_off` gives ExecuTorch's own partitioner the same
per-node check for each ``partition()`` under :func:`~.install.install` (``fusionkit
exec``). A node moves only when its arguments break a condition of
:mod:`.inspect.runtime_conditions` and the CPU runtime has its kernel
(:func:`~.runtime_support.cpu_has_kernel`): a program this changes is one the runtime could
not run right. A partition left giving the CPU ints only (the sizes a kept-off ``arange``
reads) goes to the CPU with it (:mod:`.int_only_partitions`). ExecuTorch's own delegate suite under install shows what moves
(``tests/vulkan_delegate_stock.py``: ``KEPT_OFF``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from fusionkit import events

from .runtime_support import (
    KeptOff,
    broken_condition,
    cpu_has_kernel,
    serialized_name,
    support_check_refusing,
)

__all__ = ["KEPT", "partition_keeping_broken_conditions_off"]

_LOG = logging.getLogger(__name__)

#: node name -> why, for every node a stock partitioner kept off under install (newest last)
KEPT: dict[str, str] = {}


def partition_keeping_broken_conditions_off(stock_partition: Callable[..., Any]
                                            ) -> Callable[..., Any]:
    """``VulkanPartitioner.partition`` whose per-node support check also refuses a node
    breaking a runtime condition, for this call. The adapter's own partitioner (which
    judges every runtime fact itself) is left as it is."""

    @functools.wraps(stock_partition)
    def partition(self: Any, exported_program: Any) -> Any:
        if getattr(self, "fusionkit_adapter", None) is not None:
            return stock_partition(self, exported_program)

        def refuse(node: Any) -> KeptOff | None:
            name = serialized_name(node)
            if not name or not cpu_has_kernel(name):
                return None
            broken = broken_condition(node, name, "the Vulkan runtime")
            if broken is None:
                return None
            return KeptOff(node.name, name, broken[0], f"{broken[1]}: it runs on the CPU")

        with support_check_refusing(refuse) as kept:
            result = stock_partition(self, exported_program)
        tags = result.partition_tags
        for n in result.tagged_exported_program.graph_module.graph.nodes:
            off = kept.get(n.name)
            if off is not None and n.meta.get("delegation_tag") not in tags:
                _LOG.info("fusionkit: %s", off.reason)
                KEPT[n.name] = off.reason
                events.placed("vulkan", f"kept on the CPU: {off.op}", off.reason)
        return result

    return partition
