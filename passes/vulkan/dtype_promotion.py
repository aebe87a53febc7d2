"""A binary op whose two tensor operands differ in dtype gets them cast to float32.

Replaces ``InsertDtypePromotionPass`` (``executorch/backends/vulkan/_passes/
insert_dtype_promotion.py``, run by ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1):
the Vulkan binary-op shaders read both operands in one dtype. For the ops of its
``BINARY_OPS`` list, when both operands are graph values with different dtypes, each
operand that is not float32 is read through ``_to_copy(x, dtype=float32)`` (the stock
pass's ``_promote_dtype``: any mix promotes to float32), inserted right before the op,
left operand first, as the stock pass inserts them.

It is pattern-shaped -- one binary op, two captured operands -- so it is a rule; the
stock pass's tests (tensor operands, both with a value, different dtypes) are its
constraint. What the stock pass forgets, declined here before anything changes: an
arithmetic op whose result is not float32 (float16 + int32 gives float16): the stock
pass computes it in float32 and leaves the node claiming float16, a value of another
dtype than the graph says. (``to_edge`` casts the operands of arithmetic ops itself, so
in practice only the comparisons, whose result is bool, reach this rule; a comparison of
two integers is then made in float32, exact for values up to 2**24 -- the stock choice,
kept, since the runtime lacks integer comparison shaders.)

The stock pass edits the op in place; the rule rebuilds it with the same arguments and
the op's own metadata (its value, debug handle and provenance), so the payload is the
stock pass's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, MatchResult, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes._provenance import keep_provenance
from fusionkit.passes.registry import register_rules

from ._common import constraint

STOCK_PASS = "InsertDtypePromotionPass"

#: ``insert_dtype_promotion.BINARY_OPS`` of ExecuTorch 1.5.1
BINARY_OPS: tuple[str, ...] = (
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor",
    "aten.div.Tensor_mode", "aten.pow.Tensor_Tensor", "aten.minimum.default",
    "aten.eq.Tensor", "aten.lt.Tensor", "aten.le.Tensor", "aten.gt.Tensor", "aten.ge.Tensor",
)
PROMOTED = torch.float32
CAST = "aten._to_copy.default"


def _dtype(v: Any) -> torch.dtype | None:
    val = v.meta.get("val") if isinstance(v, Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _mixed_dtypes(ctx: CheckContext, lhs: Any, rhs: Any) -> str | MatchResult | None:
    """The stock test, and the result dtype the float32 promotion keeps."""
    a, b = _dtype(lhs), _dtype(rhs)
    if a is None or b is None:
        return "an operand is not a tensor value"
    if a == b:
        return f"both operands are {a}: nothing to promote"
    out = _dtype(ctx.root)
    if out not in (PROMOTED, torch.bool):
        return (f"`{ctx.root.name}` gives {out}: computing it from float32 operands (the stock "
                "promotion) would give a value of another dtype than the graph says")
    return None


def _promoted(rw: Rewriter, lhs: Node, rhs: Node) -> Node:
    root = rw.root
    operands = []
    for v in (lhs, rhs):
        operands.append(v if _dtype(v) == PROMOTED else rw.call(CAST, v, dtype=PROMOTED))
    new = rw.call(root.target, *operands, *root.args[2:], **root.kwargs)
    keep_provenance(new, root)  # the stock pass edits the op in place
    new.meta["val"] = root.meta["val"]  # (its value too: the constraint kept its dtype)
    return new


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def dtype_promotion_rules() -> list[Rule]:
    """A binary op of two tensors of different dtypes reads them as float32."""
    return [
        Rule(name="binary_dtype_promotion",
             pattern=op(BINARY_OPS, capture("lhs"), capture("rhs"), commutative=False,
                        strict_defaults=False),
             constraints=[constraint("mixed_operand_dtypes")(_mixed_dtypes)],
             replacement=PythonReplacement(_promoted),
             description="a binary op of mixed dtypes casts its operands to float32"),
    ]


__all__ = ["BINARY_OPS", "STOCK_PASS", "dtype_promotion_rules"]
