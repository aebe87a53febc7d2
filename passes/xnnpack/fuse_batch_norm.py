"""Convolution or linear -> inference batch norm, folded into the weight and bias.

Takes over ``FuseBatchNormPass`` (``_passes/fuse_batch_norm.py``, ExecuTorch 1.5.1), which
XNNPACK's preprocess runs as Vulkan's does: the same stock class, so the same rules, those
of :mod:`fusionkit.passes.vulkan.batch_norm` (written for the Vulkan half of issue 25;
what they check inline and what the stock pass forgot is stated there: every folded
operand a constant, training-mode batch norm declined, folded weights named per match so
two convolutions sharing a weight keep their own). One difference for XNNPACK: its
payload carries each node's debug handle, and the stock pass rewrites the conv / linear
in place, so the folded op keeps that node's metadata (not the batch norm's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch.fx import Node

from fusionkit import PythonReplacement, Rewriter, Rule
from fusionkit.passes.registry import register_rules
from fusionkit.passes.vulkan.batch_norm import (
    STOCK_PASS,
    batch_norm_rules,
    fold_conv_batch_norm,
    fold_linear_batch_norm,
)

from ._common import keep_provenance


def _keep_op_provenance(rw: Rewriter, op: Node) -> None:
    """The folded conv / linear (the last op the fold created) keeps ``op``'s metadata."""
    folded = [n for n in rw.created if n.op == "call_function"][-1]
    keep_provenance(folded, op)


def _fold_conv(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Node, bn_b: Node, mean: Node,
               var: Node, eps: float, stride: Any, padding: Any, dilation: Any, transposed: Any,
               output_padding: Any, groups: Any, b: Node | None = None) -> Node:
    out = fold_conv_batch_norm(rw, op, x, w, bn_w, bn_b, mean, var, eps, stride, padding,
                               dilation, transposed, output_padding, groups, b)
    _keep_op_provenance(rw, op)
    return out


def _fold_linear(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Node, bn_b: Node,
                 mean: Node, var: Node, eps: float, b: Node | None = None) -> Node:
    out = fold_linear_batch_norm(rw, op, x, w, bn_w, bn_b, mean, var, eps, b)
    _keep_op_provenance(rw, op)
    return out


@register_rules("xnnpack", takes_over=STOCK_PASS)
def fuse_batch_norm_rules() -> list[Rule]:
    """conv -> batch norm and linear -> batch norm (the Vulkan set's rules, fresh objects)."""
    folds: dict[str, Callable[..., Node]] = {"conv_batch_norm": _fold_conv,
                                             "linear_batch_norm": _fold_linear}
    out = []
    for r in batch_norm_rules():
        assert r.name in folds, r.name
        out.append(dataclasses.replace(r, name=f"xnnpack_{r.name}",
                                       replacement=PythonReplacement(folds[r.name])))
    return out
