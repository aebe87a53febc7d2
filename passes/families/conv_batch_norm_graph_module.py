"""The conv + batch-norm family in graph-module form: the quantize step's fold.

Every PT2E quantizer's ``prepare_pt2e`` (torchao, ``quantize_pt2e.prepare_pt2e``) first
folds each convolution's batch norm into the convolution (``_fuse_conv_bn_`` ->
``fold_bn_weights_into_conv_node``, ``torchao/quantization/pt2e/utils.py``), on the graph
module ``torch.export.export(model).module()``, whose constants are ``get_attr`` nodes.
The stock fold checks nothing it reads:

* a batch-norm weight, bias, running mean or variance (or the convolution's weight or
  bias) that is a graph input or computed in the graph crashes the quantize step
  (``ValueError: Expected get_attr node, got placeholder`` / ``got call_function``);
* two convolutions sharing one weight, each with its batch norm: the first fold writes its
  folded weight into the shared attribute, the second is a "fake fuse" that drops its
  batch norm (its convolution reads the first one's folded weight);
* a convolution whose output is read beside the batch norm: the other reader gets the
  folded output;
* a batch norm in training mode is folded with its running statistics;
* a grouped transposed convolution is folded with torch's ``fuse_conv_bn_weights``, which
  assumes one group there (a shape error).

These rules state the fold with the family's pieces (:mod:`.conv_batch_norm`): the same
arithmetic as stock (torch's ``fuse_conv_bn_weights``, group by group for a grouped
transposed convolution), so where stock is right the folded weight and bias are stock's,
bit for bit. Each of the cases above is declined with a reason and the batch norm is left
as it is, for the quantizer to annotate: every folded operand is a constant; the
convolution's weight and bias are read by this convolution only (the brief: a shared
weight is never folded, so the convolutions keep sharing one tensor and one observer); the
convolution's output is read by the batch norm only (the pattern); the batch norm is in
inference mode. The folded weight and bias are new constants (the module's own
attributes are never written); the convolution is edited in place, as stock edits it.

The program form is :mod:`fusionkit.integration.graph_module_program`'s: the graph module
lifted into an ``ExportedProgram`` whose constants are placeholders.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    MatchResult,
    OperandHint,
    PrepackableConstant,
    PythonReplacement,
    Rewriter,
    Rule,
    any_value,
    capture,
    lit,
    op,
)
from fusionkit.passes._constraint import constraint

from .conv_batch_norm import (
    FOLD_ROLE,
    _affine_constant,
    _bias_constant,
    _output_only,
    _statistics_per_channel,
    fold_conv_bn,
    folded_names,
)

__all__ = ["BATCH_NORM", "CONVOLUTIONS", "LINEAR", "TRANSPOSED", "linear_rules", "rules"]

#: the convolutions ``torch.export`` writes in the quantize step's graph (torchao's
#: ``_is_conv_or_conv_transpose_node``)
CONVOLUTIONS = ("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default",
                "aten.conv1d.padding", "aten.conv2d.padding", "aten.conv3d.padding",
                "aten.conv_transpose1d.default", "aten.conv_transpose2d.input",
                "aten.conv_transpose3d.input")
TRANSPOSED = frozenset(c for c in CONVOLUTIONS if "transpose" in c)
BATCH_NORM = "aten.batch_norm.default"
BN_NO_TRAINING = "aten._native_batch_norm_legit_no_training.default"
_GROUPS = 6  # the groups argument of every convolution above (conv*d and conv_transpose*d)
#: the linear ``torch.export`` writes (torchao's ``_is_linear_node``)
LINEAR = "aten.linear.default"


def _conv() -> Any:
    return op(list(CONVOLUTIONS), capture("x"), capture("w"), lit(None) | capture("b"),
              strict_defaults=False).bind("op")


def _linear() -> Any:
    return op(LINEAR, capture("x"), capture("w"), lit(None) | capture("b"),
              strict_defaults=False).bind("op")


def _patterns(inner: Any = None) -> list[Any]:
    inner = _conv() if inner is None else inner
    params = [capture(n) for n in ("bn_w", "bn_b", "mean", "var")]
    # torch.export's training IR: batch_norm(x, w, b, mean, var, training, momentum, eps,
    # cudnn_enabled) with no getitem; older exports: the no-training op read through getitem
    plain = op(BATCH_NORM, inner, *params, any_value("training"), any_value("momentum"),
               any_value("eps"), any_value("cudnn")).bind("bn")
    legit = op(BN_NO_TRAINING, inner, *params, any_value("momentum"),
               any_value("eps")).bind("bn")
    return [plain, legit]


def _inference(ctx: CheckContext, bn: Node, training: Any = False) -> str | None:
    """A batch norm in training mode normalizes with its batch's statistics: folding its
    running ones changes what it computes."""
    if training is not False:
        return (f"batch norm `{bn.name}` is in training mode (training={training!r}): it "
                "normalizes with batch statistics, the fold would use the running ones")
    return None


def _own(ctx: CheckContext, op: Node, w: Node, b: Node | None = None) -> MatchResult | None:
    """The convolution's weight and bias are read by this convolution alone."""
    for label, v in (("weight", w), ("bias", b)):
        if isinstance(v, Node):
            others = [u.name for u in v.users if u is not op]
            if others:
                return ctx.fail(f"{label} `{v.name}` of `{op.name}` is also read by "
                                f"{', '.join(f'`{o}`' for o in others)}: a shared weight is "
                                "not folded (the folds would give each reader its own tensor)",
                                at=v)
    return None


def _groups(conv: Node) -> int:
    groups: Any = conv.args[_GROUPS] if len(conv.args) > _GROUPS else conv.kwargs.get("groups", 1)
    return int(groups)


def fold(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Any, bn_b: Any, mean: Node,
         var: Node, eps: float, b: Node | None = None) -> Node:
    """The convolution, edited in place, reading the folded weight and bias."""
    transposed = str(op.target).startswith("aten.conv_transpose")
    weight = rw.tensor(w)
    fused_w, fused_b = fold_conv_bn(
        weight, None if b is None else rw.tensor(b), rw.tensor(mean), rw.tensor(var), eps,
        None if bn_w is None else rw.tensor(bn_w), None if bn_b is None else rw.tensor(bn_b),
        transposed, _groups(op))
    return _write_folded(rw, op, w, b, fused_w, fused_b)


def _write_folded(rw: Rewriter, op: Node, w: Node, b: Node | None, fused_w: torch.Tensor,
                  fused_b: torch.Tensor) -> Node:
    """``op`` edited in place (as stock edits it) to read the folded weight and bias as two
    new constants, placed before the old weight; the batch norm's readers read ``op``."""
    w_name, b_name = folded_names(w.name, None if b is None else b.name)
    w_new = rw.fresh_constant(w_name, fused_w.detach())
    b_new = rw.fresh_constant(b_name, fused_b.detach())
    rw.move_before(w_new, w)
    rw.move_before(b_new, w)
    args = list(op.args) + [None] * (3 - len(op.args))
    args[1], args[2] = w_new, b_new
    new = rw.edit(op, tuple(args))
    if rw.root.target is not torch.ops.aten.batch_norm.default:
        for item in list(rw.root.users):  # the no-training form: its getitem(., 0) users
            rw.reroute(item, new)  # (a constraint: getitem(., 0) users only)
            rw.erase(item)
    return new


def _same_dimension(ctx: CheckContext, op: Node, x: Node) -> str | None:
    """A linear acts on the last dimension, a batch norm on dimension 1: the same one only
    for a 2-D input (torchao's own condition, pytorch/ao#4116)."""
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 2:
        rank = val.dim() if isinstance(val, torch.Tensor) else "unknown"
        return (f"the input of linear `{op.name}` is of rank {rank}, not 2: the linear "
                "transforms its last dimension, the batch norm normalizes dimension 1")
    return None


def fold_linear(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Any, bn_b: Any, mean: Node,
                var: Node, eps: float, b: Node | None = None) -> Node:
    """The linear, edited in place, reading the folded weight and bias (torch's
    ``fuse_linear_bn_weights``, as torchao folds it)."""
    from torch.nn.utils.fusion import fuse_linear_bn_weights

    zeros = torch.zeros_like(rw.tensor(mean))
    fused_w, fused_b = fuse_linear_bn_weights(
        rw.tensor(w), None if b is None else rw.tensor(b), rw.tensor(mean), rw.tensor(var),
        eps, zeros + 1 if bn_w is None else rw.tensor(bn_w),
        zeros if bn_b is None else rw.tensor(bn_b))
    return _write_folded(rw, op, w, b, fused_w, fused_b)


def _checks() -> list[Any]:
    return [PrepackableConstant(n, role=FOLD_ROLE) for n in ("w", "mean", "var")] + [
        constraint("optional_bias_is_constant")(_bias_constant),
        constraint("optional_affine_is_constant", hints={"bn_w": OperandHint(constant=True), "bn_b": OperandHint(constant=True)})(_affine_constant),
        constraint("weight_not_shared")(_own),
        constraint("statistics_per_channel")(_statistics_per_channel)]


def linear_rules() -> list[Rule]:
    """The quantize step's linear + batch-norm fold (``_fuse_linear_bn_``; both forms)."""
    plain, legit = _patterns(_linear())
    same = constraint("same_dimension")(_same_dimension)
    return [
        Rule(name="quantize_linear_batch_norm", pattern=plain,
             constraints=[constraint("inference_mode")(_inference), same, *_checks()],
             replacement=PythonReplacement(fold_linear),
             description="the quantize step's linear + batch norm fold (torch.export's "
                         "batch_norm), every operand checked"),
        Rule(name="quantize_linear_batch_norm_legit", pattern=legit,
             constraints=[constraint("batch_norm_output_only")(_output_only), same,
                          *_checks()],
             replacement=PythonReplacement(fold_linear),
             description="the quantize step's linear + batch norm fold (no-training batch "
                         "norm read through getitem), every operand checked"),
    ]


def rules() -> list[Rule]:
    """The quantize step's conv + batch-norm fold (both batch-norm forms)."""
    plain, legit = _patterns()
    return [
        Rule(name="quantize_conv_batch_norm", pattern=plain,
             constraints=[constraint("inference_mode")(_inference), *_checks()],
             replacement=PythonReplacement(fold),
             description="the quantize step's conv + batch norm fold (torch.export's "
                         "batch_norm), every operand checked"),
        Rule(name="quantize_conv_batch_norm_legit", pattern=legit,
             constraints=[constraint("batch_norm_output_only")(_output_only), *_checks()],
             replacement=PythonReplacement(fold),
             description="the quantize step's conv + batch norm fold (no-training batch "
                         "norm read through getitem), every operand checked"),
    ]

