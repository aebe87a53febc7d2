"""What the Vulkan partitioner treats as fusable: the matches fusionkit's rules accept.

ExecuTorch 1.5.1's ``VulkanPartitioner.partition`` asks the pattern registry for
"fusable subgraphs" (``patterns.get_all_fusable_subgraphs``) and delegates every node of
one without its own support check, because ``VulkanBackend.preprocess`` will fuse them
into an op the runtime has. Some ops are delegated *only* this way: the partitioner has
no entry for ``_local_scalar_dense``, which the ``select_as_symint`` fusion consumes. Once
:func:`~.install.install` takes the stock detectors out of the registry, those nodes
would stay on the CPU, and a KV-cache LLM's delegate would be cut into pieces joined by
unbacked SymInts that ExecuTorch's later passes cannot re-trace (``export_llm``'s
``ConvertToLinearPass`` fails with ``GuardOnDataDependentSymNode``).

Here the registry's answer is fusionkit's: the nodes of each match the Vulkan rules
*accept* in the program being partitioned (constraints and runtime conditions checked,
as inside preprocess), so the partition is stock's for every fusion fusionkit will make
and a declined match's ops are judged one by one. :func:`partition_with_program` wraps the
stock ``partition`` to make the program known to :func:`fusable_subgraphs` (the stock call
passes only its graph module).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any

from torch._subclasses.fake_tensor import unset_fake_temporarily

from fusionkit import find_matches

from .delegation import with_delegation_check
from .rule_ops import rule_index
from .runtime_support import _real_constants

__all__ = ["fusable_subgraphs", "partition_with_program"]

#: the program ``VulkanPartitioner.partition`` is partitioning (this thread or task)
_PROGRAM: contextvars.ContextVar[Any] = contextvars.ContextVar("fusionkit_vulkan_partitioned",
                                                               default=None)


def partition_with_program(stock_partition: Callable[..., Any]) -> Callable[..., Any]:
    """``VulkanPartitioner.partition`` with its program recorded for :func:`fusable_subgraphs`."""

    @functools.wraps(stock_partition)
    def partition(self: Any, exported_program: Any) -> Any:
        token = _PROGRAM.set(exported_program)
        try:
            return stock_partition(self, exported_program)
        finally:
            _PROGRAM.reset(token)

    return partition


def fusable_subgraphs(stock: Callable[[Any], list[Any]], graph_module: Any) -> list[Any]:
    """The fusable subgraphs of ``graph_module``: fusionkit's accepted matches, then what
    the registry entries left in place (none in 1.5.1) detect."""
    from executorch.backends.vulkan.patterns import PatternMatch

    found: list[Any] = []
    program = _PROGRAM.get()
    if program is not None and program.graph_module is graph_module:
        rules = rule_index(lambda r: with_delegation_check(r, None))
        # the partitioned program is ExecuTorch's fake copy (``get_fake_program``): the
        # rules read the real constants it was made from, outside its fake mode (else a
        # constraint on a weight's values, e.g. a zero point's, raises on a FakeTensor)
        with unset_fake_temporarily(), _real_constants(program):
            ms = find_matches(program, rules, structural_declines=False,
                              allow_folding=False, strict=False)
        for m in ms.accepted:
            claimed = list(m.claimed)
            inputs = [v for v in m.captures.values() if hasattr(v, "op") and v not in claimed]
            found.append(PatternMatch(inputs, [m.root], claimed, m.root))
    return found + list(stock(graph_module))
