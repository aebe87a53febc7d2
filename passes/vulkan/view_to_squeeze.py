"""A ``view_copy`` that only drops or adds size-1 dims -> ``squeeze_copy`` / ``unsqueeze_copy``.

Replaces ``ViewCopyToSqueezeUnsqueezePass``
(``executorch/backends/transforms/view_copy_to_squeeze_unsqueeze.py``, run by
``VulkanBackend.preprocess`` of ExecuTorch 1.5.1): ``view_copy(x, shape)`` whose shape is
``x``'s with some size-1 dims removed -> ``squeeze_copy.dims(x, dims)``; with one size-1
dim added -> ``unsqueeze_copy(x, dim)``. The dims are found as the stock pass finds
them (a left-to-right walk over both shapes), and so is what it leaves alone: a view
adding a dim at position 0 stays a view (the stock pass tests the found dim for truth,
and 0 is false), as does a view whose shape holds ``-1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    MatchResult,
    PythonReplacement,
    Rewriter,
    Rule,
    capture,
    int_list,
    op,
)
from fusionkit.passes.registry import OperandHint, register_rules

from ._common import constraint

VIEW = "aten.view_copy.default"
SQUEEZE = "aten.squeeze_copy.dims"
UNSQUEEZE = "aten.unsqueeze_copy.default"

STOCK_PASS = "ViewCopyToSqueezeUnsqueezePass"


def squeeze_dims(shape: Sequence[int], view: Sequence[int]) -> list[int] | None:
    """The dims of ``shape`` (all of size 1) whose removal gives ``view``, else None."""
    if len(shape) <= len(view):
        return None
    i = j = 0
    dims: list[int] = []
    while i < len(shape) and j < len(view):
        if shape[i] == view[j]:
            i, j = i + 1, j + 1
        elif shape[i] == 1:
            dims.append(i)
            i += 1
        else:
            return None
    return dims if i == len(shape) and j == len(view) else None


def unsqueeze_dim(shape: Sequence[int], view: Sequence[int]) -> int | None:
    """The dim of ``view`` (of size 1) whose insertion into ``shape`` gives ``view``,
    ``-1`` when it is the last one matched so, else None (the stock pass's walk)."""
    if len(view) - len(shape) != 1:
        return None
    i = j = 0
    dim = -1
    while j < len(view):
        if i == j and j == len(shape):
            if view[j] != 1:
                return None
        elif shape[i] != view[j]:
            if view[j] != 1:
                return None
            dim = j
            i -= 1
        i, j = i + 1, j + 1
    return dim


def _shape(x: Any) -> list[int] | None:
    val = x.meta.get("val") if isinstance(x, Node) else None
    return list(val.shape) if isinstance(val, torch.Tensor) else None


def _squeezes(ctx: CheckContext, x: Node, shape: Any) -> str | MatchResult | None:
    xs, view = _shape(x), list(shape)
    if xs is None or not squeeze_dims(xs, view):
        # about the view (its shape is a literal of the root), not its input
        return ctx.fail(f"the view {xs} -> {view} does not only drop size-1 dims", at=ctx.root)
    return None


def _unsqueezes(ctx: CheckContext, x: Node, shape: Any) -> str | MatchResult | None:
    xs, view = _shape(x), list(shape)
    if xs is None or not unsqueeze_dim(xs, view):  # 0: left as a view, as stock does
        return ctx.fail(f"the view {xs} -> {view} does not add one size-1 dim after dim 0",
                        at=ctx.root)
    return None


def _to_squeeze(rw: Rewriter, x: Node, shape: Any) -> Node:
    dims = squeeze_dims(list(x.meta["val"].shape), list(shape))
    return rw.call(SQUEEZE, x, dims)


def _to_unsqueeze(rw: Rewriter, x: Node, shape: Any) -> Node:
    dim = unsqueeze_dim(list(x.meta["val"].shape), list(shape))
    return rw.call(UNSQUEEZE, x, dim)


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def view_to_squeeze_rules() -> list[Rule]:
    """view_copy dropping / adding size-1 dims -> squeeze_copy.dims / unsqueeze_copy."""
    pattern = op(VIEW, capture("x"), int_list(name="shape"))
    return [
        Rule(name="view_to_squeeze", pattern=pattern,
             constraints=[constraint("drops_size1_dims", hints={"x": OperandHint(shapes=((2, 1, 3), (1, 4), (3, 1, 1, 2)))})(_squeezes)],
             replacement=PythonReplacement(_to_squeeze),
             description="a view_copy that only drops size-1 dims is a squeeze_copy"),
        Rule(name="view_to_unsqueeze", pattern=pattern,
             constraints=[constraint("adds_one_size1_dim")(_unsqueezes)],
             replacement=PythonReplacement(_to_unsqueeze),
             description="a view_copy that only adds one size-1 dim is an unsqueeze_copy"),
    ]


__all__ = ["STOCK_PASS", "squeeze_dims", "unsqueeze_dim", "view_to_squeeze_rules"]
