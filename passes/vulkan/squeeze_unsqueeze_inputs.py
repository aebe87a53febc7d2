"""A relu / gelu on a rank-3 or rank-4 value with size-1 dims runs on the squeezed value.

Replaces ``SqueezeUnsqueezeInputs`` (``executorch/backends/vulkan/_passes/
squeeze_unsqueeze_inputs.py``, run by ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1
between ``FoldQDQPass`` and ``FuseViewCopyTransform``): ``act(x)`` whose input shape the
stock ``should_squeeze`` accepts becomes ``view_copy(act(view_copy(x, squeezed)), shape)``,
``squeezed`` being ``x``'s shape with size-1 dims removed, first ones first, while it has
more than two dims. The stock test is the constraint (:func:`should_squeeze`, its cases
in its order); the new nodes carry the op's metadata, as the stock retrace gives them.

What it forgets, fixed here:

* the stock pass hands the op's keyword arguments to both views as well: a
  ``gelu(x, approximate="tanh")`` on such a shape makes its retrace die
  (``aten::view_copy() expected at most 2 argument(s) but received 3``), and the lowering
  with it. The rule gives the views only their shape.
* a shape with a dim known only at run time is declined: the stock test compares the
  example's symbolic sizes, and the squeezed shape it would bake in is not a list of ints.

``FuseViewCopyTransform``, next in the list, merges the two views through the op again
(relu and gelu are among its unary ops); the stock pass's net effect is what that leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, MatchResult, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.registry import register_rules

from ._common import constraint

STOCK_PASS = "SqueezeUnsqueezeInputs"
VIEW = "aten.view_copy.default"

#: ``SqueezeUnsqueezeInputs._squeezable_ops`` of ExecuTorch 1.5.1
SQUEEZABLE_OPS: tuple[str, ...] = ("aten.relu.default", "aten.gelu.default")


def should_squeeze(shape: Sequence[int]) -> bool:
    """The stock pass's ``should_squeeze``: which input shapes it squeezes."""
    if len(shape) == 3:
        return shape[1] == 1 and shape[0] > 1
    if len(shape) == 4:
        n, c, h, w = shape
        if n == c == h == 1:  # all dims 1 but the width
            return False
        if n == c == 1 and h > 1 and w > 1:  # a single image plane
            return False
        if n == 1 and c > 1 and h > 1 and w > 1:  # a single batch, nothing of size 1
            return False
        return 1 in shape[:-1]
    return False  # (no other rank: not worth the extra views)


def squeezed(shape: Sequence[int]) -> list[int]:
    """``shape`` with size-1 dims removed, first ones first, while it has more than 2 dims."""
    out = list(shape)
    while len(out) > 2 and 1 in out:
        out.remove(1)
    return out


def _static_shape(v: Any) -> list[int] | None:
    val = v.meta.get("val") if isinstance(v, Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    dims = list(val.shape)
    return dims if all(isinstance(d, int) for d in dims) else None


def _squeezable_input(ctx: CheckContext, x: Any) -> str | MatchResult | None:
    shape = _static_shape(x)
    if shape is None:
        val = x.meta.get("val") if isinstance(x, Node) else None
        what = (f"has the run-time shape {list(val.shape)}" if isinstance(val, torch.Tensor)
                else "has no tensor value")
        return ctx.fail(f"the input `{getattr(x, 'name', x)}` of `{ctx.root.name}` {what}: "
                        "no squeezed shape of ints to view it as", at="x")
    if not should_squeeze(shape):
        return ctx.fail(f"`{ctx.root.name}`'s input shape {shape} is not one the stock pass "
                        "squeezes (rank 3 with a size-1 channel dim, or rank 4 with a size-1 "
                        "dim outside the plain image cases)", at="x")
    return None


def _squeeze_around(rw: Rewriter, x: Node, act: Node) -> Node:
    inner = rw.call(VIEW, x, squeezed(list(x.meta["val"].shape)))
    # the op keeps its own arguments (gelu's approximate); the views get only their shape
    out = rw.call(act.target, inner, *act.args[1:], **act.kwargs)
    return rw.call(VIEW, out, list(act.meta["val"].shape))


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def squeeze_unsqueeze_inputs_rules() -> list[Rule]:
    """act(x) -> view(act(view(x, squeezed)), shape) for relu / gelu on such shapes."""
    return [
        Rule(name="squeeze_activation_input",
             pattern=op(SQUEEZABLE_OPS, capture("x"), strict_defaults=False).bind("act"),
             constraints=[constraint("squeezable_input")(_squeezable_input)],
             replacement=PythonReplacement(_squeeze_around),
             description="a relu / gelu on a value with size-1 dims runs on it squeezed"),
    ]


__all__ = [
    "SQUEEZABLE_OPS",
    "STOCK_PASS",
    "should_squeeze",
    "squeeze_unsqueeze_inputs_rules",
    "squeezed",
]
