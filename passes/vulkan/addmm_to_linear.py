"""``mm`` / ``addmm`` of a transposed weight -> ``linear``; an identity view after a linear goes.

Replaces ``AddmmToLinearTransform`` (``executorch/backends/transforms/addmm_mm_to_linear.py``,
run twice by ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1) for float graphs:

* ``addmm(b, x, t(w))`` -> ``linear(x, w, b)`` and ``mm(x, t(w))`` -> ``linear(x, w)``,
  where ``t`` is ``t_copy`` or ``permute_copy`` (the stock pass's check, stated as a
  constraint on the captured weight; the transpose itself is left to the dead-code
  sweep, so one shared by several matmuls is fine, as in the stock pass);
* ``view_copy(linear(...), shape)`` where the view's shape is the linear's own output
  shape (``replace_linear_view_copy_input_output``'s second half) -> the linear.

What the stock pass forgets, declined here: a ``permute_copy`` that is not a transpose
(dims ``[0, 1]``: ``mm(x, w)`` is not ``linear(x, w)``) and ``addmm`` with ``beta`` or
``alpha`` other than 1 (the pattern's schema defaults), both of which the stock pass
rewrites into a different computation.

The first half of ``replace_linear_view_copy_input_output`` -- a linear reading a
``view_copy`` chain from ``dequantize_per_tensor.tensor`` reads the dequantize instead --
is a quantized-graph rewrite not written as a rule: on a graph holding that op the
adapter runs the stock pass (:data:`FALLBACK_OPS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    Custom,
    MatchResult,
    PrepackableConstant,
    PythonReplacement,
    Rewriter,
    Rule,
    capture,
    int_list,
    op,
    op_key,
)
from fusionkit.passes.registry import OperandHint, register_rules

from ._common import ABSENT, constraint

MM = "aten.mm.default"
ADDMM = "aten.addmm.default"
LINEAR = "aten.linear.default"
VIEW = "aten.view_copy.default"
T_COPY = "aten.t_copy.default"
PERMUTE = "aten.permute_copy.default"

STOCK_PASS = "AddmmToLinearTransform"
#: ops on which the adapter runs the stock pass instead (the dequantize-chain bypass)
FALLBACK_OPS: frozenset[str] = frozenset({"quantized_decomposed.dequantize_per_tensor.tensor"})


def _transposed_weight(ctx: CheckContext, wt: Any) -> str | None:
    """``wt`` is ``t_copy(w)`` or ``permute_copy(w, [1, 0])`` of a 2-D ``w``."""
    key = (op_key(wt.target) or "") if isinstance(wt, Node) else ""
    if not isinstance(wt, Node) or wt.op != "call_function" or key not in (
            "aten.t_copy.default", "aten.permute_copy.default"):
        return f"the matmul's weight `{getattr(wt, 'name', wt)}` is not a transpose of a weight"
    dims: Any = wt.args[1] if key == "aten.permute_copy.default" else [1, 0]
    if [int(d) % 2 for d in dims] != [1, 0]:
        return (f"`{wt.name}` permutes dims {list(dims)}: not a transpose, so the matmul "
                "is not a linear of its input")
    w = wt.args[0]
    if not isinstance(w, Node) or not isinstance(w.meta.get("val"), torch.Tensor) \
            or w.meta["val"].dim() != 2:
        return f"`{wt.name}` does not transpose a 2-D tensor"
    return None


def _addmm_to_linear(rw: Rewriter, b: Any, x: Node, wt: Node) -> Node:
    return rw.call(LINEAR, x, wt.args[0], b)


def _mm_to_linear(rw: Rewriter, x: Node, wt: Node) -> Node:
    return rw.call(LINEAR, x, wt.args[0])


def _identity_view(ctx: CheckContext, linear: Node) -> str | MatchResult | None:
    """The view's shape is the linear's output shape: it changes nothing."""
    view = ctx.root
    a, b = linear.meta.get("val"), view.meta.get("val")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) \
            or list(a.shape) != list(b.shape):
        # the view is at fault (it reshapes), not the linear it reads
        return ctx.fail(f"`{view.name}` reshapes the linear's output (not an identity view)",
                        at=view)
    return None


def _keep_linear(rw: Rewriter, linear: Node, x: Node, w: Node, b: Any = ABSENT) -> Node:
    rw.insert_at(linear)  # the stock pass keeps the linear where it was
    # a bias given as an explicit None stays an argument, as in the linear it rebuilds
    return rw.call(LINEAR, x, w) if b is ABSENT else rw.call(LINEAR, x, w, b)


#: Vulkan's ``linear`` prepacks its weight (``Linear.cpp``: ``prepack_fp_linear_weight``),
#: while its ``addmm`` / ``mm`` also take a weight computed at run time (``addmm_tiled``'s
#: ``val_is_tref`` branch): a ``linear`` of a computed weight makes the runtime abort
PREPACKED_WEIGHT = PrepackableConstant(
    "w", role="Vulkan's linear prepacks its weight (the runtime aborts in "
              "prepack_fp_linear_weight), its addmm/mm does not")


def _prepackable_weight(ctx: CheckContext, wt: Any) -> MatchResult | None:
    """:data:`PREPACKED_WEIGHT` of the weight ``wt`` transposes, where a dequantize of a
    constant counts as one (a quantized weight: FuseQuantizedOps packs it, or the
    partitioner keeps it off).

    The weight is not a capture of the pattern because the transpose cannot be in it: a
    node a match claims must be dead after the rewrite, and a transpose shared by several
    matmuls (``wt = w.t()``; ``x @ wt + y @ wt``) is not until the last one is converted,
    so none would be (the stock pass converts them all, and so do these rules)."""
    w = wt.args[0] if isinstance(wt, Node) and wt.args else wt
    if isinstance(w, Node) and w.op == "call_function" and w.args \
            and "dequantize" in (op_key(w.target) or ""):
        w = w.args[0]  # the constant under the dequantize
    return PREPACKED_WEIGHT.check(dataclasses.replace(ctx, captures={"w": w}))


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def vulkan_addmm_to_linear_rules() -> list[Rule]:
    """The rules below for Vulkan: only a constant weight becomes a linear's (prepacked)."""
    return addmm_to_linear_rules(prepacked_weight=True)


def addmm_to_linear_rules(prepacked_weight: bool = False) -> list[Rule]:
    """addmm / mm of a transposed weight -> linear; an identity view after a linear goes.

    ``prepacked_weight``: the target's linear prepacks its weight, so a weight computed
    in the graph is declined (Vulkan); XNNPACK's ConvertToLinear takes any weight."""
    transposed = constraint("transposed_weight", hints={"wt": OperandHint(producer="transpose")})(_transposed_weight)
    weight_checks = [transposed, Custom(_prepackable_weight, "constant_weight")] \
        if prepacked_weight else [transposed]
    linear = (op(LINEAR, capture("x"), capture("w"))
              | op(LINEAR, capture("x"), capture("w"), capture("b"))).bind("linear")
    return [
        Rule(name="addmm_to_linear",
             pattern=op(ADDMM, capture("b"), capture("x"), capture("wt")),
             constraints=weight_checks,
             replacement=PythonReplacement(_addmm_to_linear),
             description="addmm(b, x, t(w)) -> linear(x, w, b)"),
        Rule(name="mm_to_linear",
             pattern=op(MM, capture("x"), capture("wt")),
             constraints=weight_checks,
             replacement=PythonReplacement(_mm_to_linear),
             description="mm(x, t(w)) -> linear(x, w)"),
        Rule(name="linear_identity_view",
             pattern=op(VIEW, linear, int_list(name="shape")),
             constraints=[constraint("identity_view")(_identity_view)],
             replacement=PythonReplacement(_keep_linear),
             description="a view_copy to the linear's own output shape is dropped"),
    ]


__all__ = ["FALLBACK_OPS", "STOCK_PASS", "addmm_to_linear_rules"]
