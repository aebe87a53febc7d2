"""Copies that change neither dtype nor shape are removed: their users read the source.

Replaces ``RemoveRedundantOpsTransform`` (``executorch/backends/vulkan/_passes/
remove_redundant_ops.py``, run by ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1):
``clone``, ``alias``, ``alias_copy``, ``lift_fresh_copy``, ``_to_dim_order_copy``,
``_clone_dim_order``, ``expand_copy`` and ``copy(self, src)`` (whose source is ``src``)
are replaced by their source when the source has the node's dtype and shape -- the
stock pass's own test (``_should_remove``), stated as a constraint. Nothing the stock
pass forgets was found: a dtype or shape change is kept, whatever the op's other
arguments say (memory format and dim order are the Vulkan layout passes' business).

What the stock pass forgets: a copy the program returns, whose source is a graph input or
a value the program returns already. Rerouted to its source, the delegate returns one
value for two outputs ('Vulkan graph declares 1 inputs and 1 outputs, but the delegate call
supplied 3 arguments' at execute) or its own input; the core declines that rewiring
(``fusionkit.find.returned_values``), and ``redundant_copy_returned`` makes such a copy an
``aten.clone`` (the runtime lacks ``_clone_dim_order``, the edge program's clone).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, MatchResult, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.registry import register_rules

from ._common import constraint

STOCK_PASS = "RemoveRedundantOpsTransform"

#: ops whose source is their first argument
FIRST_ARG_OPS: tuple[str, ...] = (
    "aten.clone.default", "aten.alias.default", "aten.alias_copy.default",
    "aten.lift_fresh_copy.default", "dim_order_ops._to_dim_order_copy.default",
    "dim_order_ops._clone_dim_order.default", "aten.expand_copy.default",
)
COPY = "aten.copy.default"  # copy(self, src): the source is src
CLONE = "aten.clone.default"  # the copy the Vulkan runtime runs (Clone.cpp)


def _same_dtype_and_shape(ctx: CheckContext, src: Any) -> str | MatchResult | None:
    node = ctx.root
    a, b = getattr(src, "meta", {}).get("val"), node.meta.get("val")
    if not isinstance(a, torch.Tensor):
        return f"the source `{getattr(src, 'name', src)}` of `{node.name}` has no tensor value"
    # otherwise it is the copy that changes something: blamed on it, not on its source
    if not isinstance(b, torch.Tensor):
        return ctx.fail(f"`{node.name}` has no tensor value", at=node)
    if a.dtype != b.dtype:
        return ctx.fail(f"`{node.name}` converts {a.dtype} to {b.dtype}", at=node)
    if a.shape != b.shape:
        return ctx.fail(f"`{node.name}` changes the shape {list(a.shape)} to {list(b.shape)}",
                        at=node)
    return None


def _source(rw: Rewriter, src: Node) -> Node:
    return src


def _returned(ctx: CheckContext) -> str | MatchResult | None:
    """The copy is a value the program returns (its source could not take its place)."""
    if any(u.op == "output" for u in ctx.root.users):
        return None
    return ctx.fail(f"`{ctx.root.name}` is not returned by the program: its users read the "
                    "source (redundant_copy)", at=ctx.root)


def _clone(rw: Rewriter, src: Node) -> Node:
    return rw.call(CLONE, src)


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def redundant_ops_rules() -> list[Rule]:
    """A copy-like op that changes neither dtype nor shape -> its source."""
    check = constraint("same_dtype_and_shape")(_same_dtype_and_shape)
    return [
        Rule(name="redundant_copy",
             pattern=(op(FIRST_ARG_OPS, capture("src"), strict_defaults=False)
                      | op(COPY, capture("self"), capture("src"), strict_defaults=False)),
             constraints=[check],
             replacement=PythonReplacement(_source),
             description="a clone / alias / copy keeping dtype and shape is its source"),
        # a returned copy whose source cannot take its place among the outputs (a graph
        # input, or a value the program returns already: the core declines that) still
        # goes as an op the runtime has (it lacks _clone_dim_order, which the partitioner
        # delegates on the understanding that preprocess removes it)
        Rule(name="redundant_copy_returned",
             pattern=(op(tuple(o for o in FIRST_ARG_OPS if o != CLONE), capture("src"),
                         strict_defaults=False)
                      | op(COPY, capture("self"), capture("src"), strict_defaults=False)),
             constraints=[check, constraint("returned_by_the_program")(_returned)],
             replacement=PythonReplacement(_clone),
             priority=-1,
             description="a returned copy whose source is returned or an input -> aten.clone"),
    ]


__all__ = ["STOCK_PASS", "redundant_ops_rules"]
