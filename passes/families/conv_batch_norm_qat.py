"""The conv + batch-norm family in QAT form: ``prepare_qat_pt2e``'s training subgraph.

torchao's ``prepare_qat_pt2e`` (``quantize_pt2e.py``) does not fold a batch norm into its
convolution: after the quantizer annotated the graph module it rewrites each convolution +
batch norm into a training subgraph (``qat_utils._fuse_conv_bn_qat``)::

    scale = bn_w / sqrt(var + 1e-5)
    y = conv(x, w * scale, 0) / scale + b          # the weight fake-quantized as scaled
    y = batch_norm(y, mean, var, bn_w, bn_b, training=True, momentum=0.1, eps=1e-5)

and ``convert_pt2e`` folds that subgraph (``_fold_conv_bn_qat`` ->
``fold_bn_weights_into_conv_node``). The stock rewrite matches with literals ignored and
checks nothing it reads:

* a convolution or batch-norm operand that is a graph input or computed in the graph is
  rewritten, and ``convert_pt2e``'s fold crashes on it (``Expected get_attr node, got
  placeholder`` / ``got call_function``), after the training;
* two convolutions sharing one weight are both rewritten, and the convert step folds both
  batch norms into the one weight: the converted model computes another model;
* the subgraph's literals are the pattern's (``eps=1e-5``, ``momentum=0.1``): a batch norm
  with another ``eps`` computes another model, one with another ``momentum`` trains its
  running statistics at another rate;
* a grouped transposed convolution scales its weight along an axis of ``out / groups``
  channels by ``out`` factors: a shape error at the first training step.

These rules state which convolution + batch norm may be rewritten: every operand a constant
(the convert step reads each as an attribute), the convolution's weight and bias read by it
alone, its output read by the batch norm alone (the pattern), the batch norm's literals the
subgraph's, one group where the convolution is transposed. The replacement is torchao's own
subgraph (traced by torchao, for the installed version), inlined: what the convert step
recognises. A declined pair is left as it is: a convolution the quantizer annotated and a
batch norm that trains as the user wrote it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch.fx import GraphModule, Node

from fusionkit import (
    CheckContext,
    MatchResult,
    PythonReplacement,
    Rewriter,
    Rule,
    any_value,
    capture,
    lit,
    op,
)
from fusionkit.passes._constraint import constraint

from .conv_batch_norm import _optional_constant, _statistics_per_channel
from .conv_batch_norm_graph_module import BATCH_NORM, _groups, _own

__all__ = ["QAT_CONVOLUTIONS", "QAT_EPS", "QAT_MOMENTUM", "rules"]

#: the convolutions ``_fuse_conv_bn_qat`` rewrites (F.conv1d / conv2d / conv_transpose1d /
#: conv_transpose2d, as torch.export writes them)
QAT_CONVOLUTIONS = {"aten.conv1d.default": "conv1d", "aten.conv2d.default": "conv2d",
                    "aten.conv_transpose1d.default": "conv_transpose1d",
                    "aten.conv_transpose2d.input": "conv_transpose2d"}
#: the literals torchao's training subgraph writes (its ``bn_eps`` and F.batch_norm's default)
QAT_EPS, QAT_MOMENTUM = 1e-5, 0.1
_ROLE = "convert_pt2e's fold reads it as a module attribute"


def _pattern() -> Any:
    conv = op(list(QAT_CONVOLUTIONS), capture("x"), capture("w"), lit(None) | capture("b"),
              strict_defaults=False).bind("op")
    return op(BATCH_NORM, conv, capture("bn_w"), capture("bn_b"), capture("mean"),
              capture("var"), any_value("training"), any_value("momentum"), any_value("eps"),
              any_value("cudnn")).bind("bn")


def _constant(ctx: CheckContext, v: Any, label: str) -> MatchResult | None:
    if v is None:
        return ctx.fail(f"{label} is None: torchao's training subgraph divides by the "
                        "batch-norm weight and adds its bias", at=ctx.root)
    if isinstance(v, Node) and ctx.inputs.constant(v) is None:
        return ctx.fail(f"{label} `{v.name}` is {ctx.inputs.describe(v)}, not a constant: "
                        f"{_ROLE}", at=v)
    return _optional_constant(ctx, v, label)


def _operands_constant(ctx: CheckContext, w: Node, mean: Node, var: Node, bn_w: Any = None,
                       bn_b: Any = None, b: Node | None = None) -> MatchResult | None:
    """Every operand the convert step folds is a constant (an attribute there)."""
    for label, v in (("convolution weight", w), ("batch-norm weight", bn_w),
                     ("batch-norm bias", bn_b), ("running mean", mean),
                     ("running variance", var)):
        failed = _constant(ctx, v, label)
        if failed is not None:
            return failed
    return None if b is None else _constant(ctx, b, "convolution bias")


def _same_literals(ctx: CheckContext, bn: Node, eps: Any, momentum: Any) -> str | None:
    """The batch norm's ``eps`` and ``momentum`` are the ones the subgraph writes."""
    if not isinstance(eps, (int, float)) or not math.isclose(eps, QAT_EPS, rel_tol=1e-9):
        return (f"batch norm `{bn.name}` has eps={eps!r}: torchao's training subgraph writes "
                f"eps={QAT_EPS} (its scale and its batch norm), another model")
    if momentum != QAT_MOMENTUM:
        return (f"batch norm `{bn.name}` has momentum={momentum!r}: torchao's training "
                f"subgraph writes momentum={QAT_MOMENTUM}, its running statistics would "
                "train at another rate")
    return None


def _one_group_if_transposed(ctx: CheckContext, op: Node) -> str | None:
    """A transposed convolution's weight is (in, out / groups, ...): the subgraph scales its
    axis 1 by ``out`` factors, which fits one group only."""
    if "transpose" in str(op.target) and _groups(op) != 1:
        return (f"`{op.name}` is a transposed convolution of {_groups(op)} groups: torchao's "
                "training subgraph scales its weight's axis 1 by one factor per output "
                "channel (a shape error)")
    return None


@functools.cache
def training_subgraph(conv: str, rank: int, has_bias: bool) -> GraphModule:
    """torchao's training subgraph for ``conv`` (a ``QAT_CONVOLUTIONS`` name) on rank-``rank``
    input, as torchao traces it (``_get_aten_graph_module_for_pattern``)."""
    import torch.nn.functional as F
    from torchao.quantization.pt2e import qat_utils
    from torchao.quantization.pt2e.utils import _get_aten_graph_module_for_pattern

    x, w = (torch.randn(1, 1, 3), torch.randn(1, 1, 1)) if rank == 3 else \
        (torch.randn(1, 1, 3, 3), torch.randn(1, 1, 1, 1))
    # (five distinct vectors: export traces one tensor passed twice as one input)
    vectors = tuple(torch.randn(1) for _ in range(5))
    make = qat_utils._get_qat_conv_bn_pattern if has_bias else \
        qat_utils._get_qat_conv_bn_pattern_no_conv_bias
    return _get_aten_graph_module_for_pattern(make(getattr(F, conv)), (x, w, *vectors), False)


def rewrite(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Node, bn_b: Node, mean: Node,
            var: Node, b: Node | None = None) -> Node:
    """torchao's training subgraph in place of the convolution + batch norm, the
    convolution's own literal arguments (stride, padding, ...) kept, as torchao keeps them."""
    rank = len(x.meta["val"].shape)
    sub = training_subgraph(QAT_CONVOLUTIONS[str(op.target)], rank, b is not None)
    inputs = iter([x, w, b, bn_w, bn_b, mean, var])
    env: dict[Node, Any] = {}
    out: Node | None = None
    for n in sub.graph.nodes:
        if n.op == "placeholder":
            env[n] = next(inputs)
        elif n.op == "call_function":
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
            if str(n.target) == str(op.target):
                args = (*args[:3], *([None] * (3 - len(args))), *op.args[3:])
            env[n] = rw.call(n.target, *args, **kwargs)
        elif n.op == "output":
            out = torch.utils._pytree.tree_leaves(n.args[0])[0]
            out = env[out]
    assert out is not None, "torchao's training subgraph returns nothing"
    return out


def rules() -> list[Rule]:
    """``prepare_qat_pt2e``'s convolution + batch-norm rewrite, every operand checked."""
    return [Rule(
        name="qat_conv_batch_norm", pattern=_pattern(),
        constraints=[constraint("operands_constant")(_operands_constant),
                     constraint("weight_not_shared")(_own),
                     constraint("literals_as_rewritten")(_same_literals),
                     constraint("one_group_if_transposed")(_one_group_if_transposed),
                     constraint("statistics_per_channel")(_statistics_per_channel)],
        replacement=PythonReplacement(rewrite),
        description="prepare_qat_pt2e's convolution + batch norm training subgraph, every "
                    "operand checked")]
