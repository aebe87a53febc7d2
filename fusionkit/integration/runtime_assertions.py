"""A partition's runtime assertions go with the symbol they bound.

``torch.export`` keeps what a model states about a data-dependent int (``.item()``;
``torch._check_is_size``, ``torch._check``) as graph nodes with no users:
``_assert_scalar(ge(u0, 0))``. A lowered partition is re-traced in the backend's
preprocess, and only those nodes tell the re-trace that ``u0 >= 0``: a
``slice(freqs, 0, u0, u0 + s)`` without them raises ``GuardOnDataDependentSymNode:
Could not guard on data-dependent expression u0 < 0``.

``CapabilityBasedPartitioner`` merges user-less nodes into whichever partition it is
building: when a graph splits into several partitions (an op kept on the CPU between two
runs of delegated ops), the assertions may land in one partition while the ``.item()``
and the slice that reads it land in another. ExecuTorch's own export of ``export_llm``'s
llama with ``model.expand_rope_table=True`` on Vulkan splits that way when the
rope is not fused. Here each assertion (with the comparisons only it reads) moves into
a partition that already has every value it reads (computes it, or reads it for another
node): it adds no edge between partitions, so no cycle, and the program computes the same.
A partition left reading a symbol only for an assertion would also break: Vulkan's
preprocess removes assertions, and the serialized graph then declares one input fewer
than the delegate call passes (the runtime aborts at execute).
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Collection
from typing import Any

import torch
from torch.fx import GraphModule, Node

from fusionkit import events
from fusionkit.integration.partition_tags import empty_partitions, untag

__all__ = ["ASSERTION_TARGETS", "keep_assertions_with_symbols", "partition_keeping_assertions"]

_LOG = logging.getLogger(__name__)

#: why an assertion moved (the exec report's line)
MOVED_WHY = ("a runtime assertion on a data-dependent int moved into the partition "
             "computing the int (the backend's re-trace needs it there)")

#: nodes that only state a fact about a symbol (no users, no value)
ASSERTION_TARGETS: frozenset[Any] = frozenset({
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten.sym_constrain_range.default,
})

#: the scalar arithmetic an assertion's predicate is built from
_PREDICATE_TARGETS: frozenset[Any] = frozenset({
    operator.ge, operator.gt, operator.le, operator.lt, operator.eq, operator.ne,
    operator.and_, operator.or_, operator.not_, operator.add, operator.sub, operator.mul,
    operator.floordiv, operator.mod, operator.neg,
    torch.sym_not, torch.sym_max, torch.sym_min,
})


def _predicate(assertion: Node) -> tuple[list[Node], list[Node]]:
    """The nodes only ``assertion`` reads (its predicate: the comparisons, in graph
    order) and the values they read from the rest of the graph."""
    own: dict[Node, None] = {assertion: None}
    reads: dict[Node, None] = {}
    stack = list(assertion.all_input_nodes)
    while stack:
        n = stack.pop()
        if n in own or n in reads:
            continue
        if (n.op == "call_function" and n.target in _PREDICATE_TARGETS
                and all(u in own for u in n.users)):
            own[n] = None
            stack.extend(n.all_input_nodes)
        else:
            reads[n] = None
    # a node first seen as read-from may turn out to be the predicate's own
    outside = [n for n in reads if n not in own]
    order = {n: i for i, n in enumerate(assertion.graph.nodes)}
    return sorted(own, key=order.__getitem__), outside


def keep_assertions_with_symbols(graph_module: GraphModule,
                                 partition_tags: Collection[str]) -> list[tuple[str, str, str]]:
    """Re-tag each delegated assertion (with its predicate) into a partition that already
    has every value it reads: one that computes it or reads it for another node. Returns
    (assertion, from tag, to tag) per move.

    The partition kept is the assertion's own when that one qualifies, else the first
    that computes one of the values read. An assertion no partition qualifies for stays."""
    nodes = list(graph_module.graph.nodes)
    assertions = [n for n in nodes if n.op == "call_function" and n.target in ASSERTION_TARGETS
                  and n.meta.get("delegation_tag") in partition_tags]
    predicates = {a: _predicate(a) for a in assertions}
    predicate_nodes = {n for own, _ in predicates.values() for n in own}
    # what each partition reads from outside itself, for nodes other than assertions
    has: dict[str, set[Node]] = {}
    for n in nodes:
        tag = n.meta.get("delegation_tag")
        if tag not in partition_tags or n in predicate_nodes:
            continue
        here = has.setdefault(tag, set())
        here.add(n)
        here.update(n.all_input_nodes)
    moved: list[tuple[str, str, str]] = []
    for a in assertions:
        own, reads = predicates[a]
        computed = [n for n in reads if n.op == "call_function"]
        tag = a.meta["delegation_tag"]
        candidates = [tag, *dict.fromkeys(n.meta.get("delegation_tag") for n in computed)]
        home = next((t for t in candidates if t in partition_tags
                     and all(n in has.get(t, ()) for n in computed)), None)
        if home is None or home == tag:
            continue
        for n in own:
            n.meta["delegation_tag"] = home
        moved.append((a.name, tag, home))
    return moved


def partition_keeping_assertions(stock_partition: Callable[..., Any], backend: str
                                 ) -> Callable[..., Any]:
    """A partitioner's ``partition`` with :func:`keep_assertions_with_symbols` applied to
    its result (the tags are on the program the partitioner was given); each move is told
    to :func:`fusionkit.events.placed` as ``backend``'s."""

    @functools.wraps(stock_partition)
    def partition(self: Any, exported_program: Any) -> Any:
        result = stock_partition(self, exported_program)
        gm = result.tagged_exported_program.graph_module
        moved = keep_assertions_with_symbols(gm, result.partition_tags)
        if moved:
            # a partition that only held moved assertions is no partition any more
            untag(gm, result.partition_tags, empty_partitions(gm, result.partition_tags))
            _LOG.info("fusionkit: %d runtime assertion(s) moved to the partition computing "
                      "the symbol they bound", len(moved))
        for _ in moved:
            events.placed(backend, "runtime assertion moved to its int's partition", MOVED_WHY)
        return result

    return partition
