"""Views around unary elementwise ops merge into one view, first in the chain.

Replaces ``FuseViewCopyTransform`` (``executorch/backends/transforms/fuse_view_copy.py``,
run by ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1):
``view_copy(u_k(...u_1(view_copy(x, s0))...), s1)`` -> ``u_k(...u_1(view_copy(x, s1))...)``
for the stock pass's unary elementwise ops ``u_i`` (each used only by the next: the
pattern's pass-through nodes are used only inside the match, the stock pass's
single-user walk). A longer chain of views merges over rounds (each round merges one
pair), to the stock pass's result: the first view gets the last view's shape, the
later views go. The unary ops are rebuilt where they were (the serializer numbers
operators in graph order), with their values re-derived for the new shape.
"""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from fusionkit import PythonReplacement, Rewriter, Rule, capture, int_list, op, through
from fusionkit.passes._provenance import keep_provenance
from fusionkit.passes.registry import register_rules

VIEW = "aten.view_copy.default"
STOCK_PASS = "FuseViewCopyTransform"

#: ``FuseViewCopyTransform.UNARY_ELEMENTWISE_OPS`` of ExecuTorch 1.5.1
UNARY_ELEMENTWISE_OPS: tuple[str, ...] = (
    "aten.alias_copy.default", "aten.clone.default", "dim_order_ops._clone_dim_order.default",
    "aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default",
    "quantized_decomposed.quantize_per_tensor.default",
    "quantized_decomposed.dequantize_per_tensor.default",
    "aten.abs.default", "aten.clamp.default", "aten.ceil.default", "aten.floor.default",
    "aten.neg.default", "aten.relu.default", "aten.round.default", "aten.sigmoid.default",
    "aten.silu.default", "aten.sqrt.default", "aten.tanh.default", "aten.sign.default",
    "aten.reciprocal.default", "aten.gelu.default", "aten.rsqrt.default", "aten.exp.default",
    "aten.log.default",
)


def _merge(rw: Rewriter, first: Node, inner: Node, x: Node, shape: Any) -> Node:
    chain: list[Node] = []  # the unary ops between the two views, last first
    n = inner
    while n is not first:
        chain.append(n)
        n = n.args[0]  # type: ignore[assignment]
    rw.insert_at(first)
    out = rw.call(VIEW, x, list(shape))
    keep_provenance(out, first)  # the stock pass gives the first view the new shape
    for u in reversed(chain):
        rw.insert_at(u)
        out = rw.call(u.target, out, *u.args[1:], **u.kwargs)
        keep_provenance(out, u)  # ... and leaves the unary ops as they were
    return out


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def fuse_view_copy_rules() -> list[Rule]:
    """view(unary*(view(x, s0)), s1) -> unary*(view(x, s1))."""
    first = op(VIEW, capture("x"), int_list()).bind("first")
    # narrowing: quantize / dequantize are rebuilt, not skipped, so no value changes
    inner = through(UNARY_ELEMENTWISE_OPS, first, max_depth=64, narrowing=True).bind("inner")
    return [
        Rule(name="fuse_view_copy",
             pattern=op(VIEW, inner, int_list(name="shape")),
             constraints=[],
             replacement=PythonReplacement(_merge),
             description="a view after unary elementwise ops after a view: one view, first"),
    ]


__all__ = ["STOCK_PASS", "UNARY_ELEMENTWISE_OPS", "fuse_view_copy_rules"]
