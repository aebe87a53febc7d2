"""Convolution / linear -> inference batch norm, folded into the weight and bias: the family.

One definition of the fusion that three backends' stock passes hand-write: Vulkan's and
XNNPACK's ``FuseBatchNormPass`` (``executorch/backends/xnnpack/_passes/
fuse_batch_norm.py``, run by both backends' preprocess) and Arm's ``FuseBatchNorm2dPass``
(``executorch/backends/arm/_passes/fuse_batch_norm2d_pass.py``). The pattern is
``batch_norm(conv_or_linear(x, w, b, ...), bn_w, bn_b, mean, var, ..., eps)``, read
through ``getitem(., 0)`` only, -> ``conv_or_linear(x, w', b', ...)`` (the getitems read it
instead), with ``w', b'`` from torch's own ``fuse_conv_bn_weights`` /
``fuse_linear_bn_weights`` (the stock passes' functions, so the folded bytes are the same;
a grouped transposed convolution is folded group by group, as Arm's pass does, because
torch's function assumes one group there).

What every backend gets, checked before anything changes: the conv / linear has one
user, the batch norm (the pattern: an intermediate is used only inside the match); the
batch norm only ``getitem(., 0)`` users; every operand that is folded -- the conv / linear
weight and bias, the batch norm's weight, bias, running mean and variance -- is a constant
(a graph input or a value computed in the graph is not: the stock passes read such a
weight as "no weight" or kill the lowering); a ``native_batch_norm`` in training mode
(batch statistics) is not folded. Each fold gets its own new constants, never one found
by name: they are named as the stock passes name them (:func:`folded_names`:
``<weight>_fused_bn``, ``<bias>_fused_bn``), made unique where that name is taken (the
stock passes find a folded constant by that name, so two convolutions sharing a weight,
each with its own batch norm, both got the first one's; here the second is
``<weight>_fused_bn_1``).

What a backend's replacement needs is a :class:`Needs`: the rule names' prefix, whether
linears are folded, whether the batch norm's weight and bias may be absent (an
``affine=False`` batch norm), which dtypes are folded (then the folded operands' dtypes and
shapes are checked too), which input ranks a convolution may have, and whether a batch
norm with nothing to fold into becomes a 1x1 depthwise convolution (Arm, whose TOSA has no
batch norm). :func:`rules` builds the rules from it; the replacements are the same for
every backend (the folded constants sit where the source weight was, graph and signature,
as the stock passes place them: the Vulkan serializer numbers values in placeholder order,
so its payload stays byte-identical).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    DtypeIn,
    MatchResult,
    OperandHint,
    PrepackableConstant,
    PythonReplacement,
    Rank,
    Rewriter,
    Rule,
    any_value,
    capture,
    lit,
    op,
)
from fusionkit.passes._constraint import constraint
from fusionkit.passes._provenance import keep_provenance

__all__ = ["BN", "BN_NO_TRAINING", "CONV", "FOLD_ROLE", "LINEAR", "Needs", "fold_conv",
           "fold_conv_bn", "fold_linear", "fold_standalone", "folded_names", "rules"]

CONV = "aten.convolution.default"
LINEAR = "aten.linear.default"
BN_NO_TRAINING = "aten._native_batch_norm_legit_no_training.default"
BN = "aten.native_batch_norm.default"

_CONV_ARGS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")
_BN_PARAMS = ("bn_w", "bn_b", "mean", "var")

#: why every folded operand must be a constant
FOLD_ROLE = "its value is folded into the new weight and bias at lowering time"


@dataclass(frozen=True)
class Needs:
    """What one backend's conv + batch norm replacement needs (the family's parameters)."""

    #: prefix of the rule names (``"xnnpack_"``: ``xnnpack_conv_batch_norm``)
    prefix: str = ""
    #: a linear's batch norm is folded too
    linear: bool = True
    #: ranks of a convolution's input that are folded
    conv_ranks: frozenset[int] = frozenset({3, 4})
    #: the batch norm's weight and bias may be absent (``affine=False``: ones and zeros)
    optional_affine: bool = False
    #: the dtypes folded; None: any (then dtypes and shapes are not checked)
    dtypes: frozenset[torch.dtype] | None = None
    #: a batch norm with no conv to fold into becomes a 1x1 depthwise convolution
    standalone: bool = False


def _batch_norm(inner: Any) -> Any:
    """``bn(inner, ...)`` for both inference forms of the batch norm."""
    params = [capture(n) for n in _BN_PARAMS]
    legit = op(BN_NO_TRAINING, inner, *params, any_value("momentum"), any_value("eps"))
    # training=True normalizes with batch statistics: not foldable
    native = op(BN, inner, *params, lit(False), any_value("momentum"), any_value("eps"))
    # the root is the batch norm itself (patterns name operator overloads, not getitem);
    # its getitem(., 0) users are checked by a constraint and rerouted by the replacement
    return (legit | native).bind("bn")


def _conv_pattern() -> Any:
    conv = op(CONV, capture("x"), capture("w"), lit(None) | capture("b"),
              *(any_value(n) for n in _CONV_ARGS)).bind("op")
    return _batch_norm(conv)


def _linear_pattern() -> Any:
    linear = (op(LINEAR, capture("x"), capture("w"))
              | op(LINEAR, capture("x"), capture("w"), lit(None) | capture("b"))).bind("op")
    return _batch_norm(linear)


def folded_names(weight: str, bias: str | None) -> tuple[str, str]:
    """The names the stock passes request for the folded weight and bias of the weight
    placeholder ``weight`` and bias placeholder ``bias`` (None: no bias): ``<weight>_fused_bn``
    and ``<bias>_fused_bn``, without a bias ``<weight>`` with ``weight`` read ``bias``, or
    ``<weight>_bias_fused_bn`` (Arm's ``FuseBatchNorm2dPass.get_bias_name``). Only requested:
    ``Rewriter.fresh_constant`` makes each unique (two convolutions sharing one weight)."""
    if bias is not None:
        b = f"{bias}_fused_bn"
    elif "weight" in weight:
        b = weight.replace("weight", "bias") + "_fused_bn"
    else:
        b = f"{weight}_bias_fused_bn"
    return f"{weight}_fused_bn", b


def _tensor(rw: Rewriter, v: Any) -> torch.Tensor | None:
    return rw.tensor(v) if isinstance(v, Node) else None


def fold_conv_bn(weight: torch.Tensor, bias: torch.Tensor | None, mean: torch.Tensor,
                 var: torch.Tensor, eps: float, bn_w: torch.Tensor | None,
                 bn_b: torch.Tensor | None, transposed: bool, groups: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The folded weight and bias of a convolution (torch's ``fuse_conv_bn_weights``; a
    grouped transposed convolution, whose weight is ``[Cin, Cout/groups, ...]``, group by
    group)."""
    from torch.nn.utils.fusion import fuse_conv_bn_weights

    if not (transposed and groups > 1):
        fw, fb = fuse_conv_bn_weights(weight, bias, mean, var, eps, bn_w, bn_b, transposed)
        return fw, fb
    cin, cout = weight.size(0) // groups, mean.numel() // groups
    ws: list[torch.Tensor] = []
    bs: list[torch.Tensor] = []
    for g in range(groups):
        out = slice(g * cout, (g + 1) * cout)
        fw, fb = fuse_conv_bn_weights(
            weight[g * cin:(g + 1) * cin], None if bias is None else bias[out], mean[out],
            var[out], eps, None if bn_w is None else bn_w[out],
            None if bn_b is None else bn_b[out], True)
        ws.append(fw)
        bs.append(fb)
    return torch.cat(ws), torch.cat(bs)


def _reroute(rw: Rewriter, new: Node) -> Node:
    """The batch norm's getitem(., 0) users read ``new`` (a program output's spec names it)
    and go; the batch norm (the match's root, whose tuple nothing reads now) is returned:
    it stands for itself and is erased with the claimed nodes."""
    for item in list(rw.root.users):
        rw.reroute(item, new)
        rw.erase(item)
    return rw.root


def fold_conv(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Any, bn_b: Any, mean: Node,
              var: Node, eps: float, stride: Any, padding: Any, dilation: Any, transposed: Any,
              output_padding: Any, groups: Any, b: Node | None = None) -> Node:
    """The replacement of ``conv_batch_norm``: the convolution ``op`` with folded weight and
    bias."""
    return _fold(rw, op, x, w, b, (bn_w, bn_b, mean, var), eps,
                 (stride, padding, dilation, transposed, output_padding, groups))


def fold_linear(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Any, bn_b: Any, mean: Node,
                var: Node, eps: float, b: Node | None = None) -> Node:
    """The replacement of ``linear_batch_norm``: the linear ``op`` with folded weight and bias."""
    return _fold(rw, op, x, w, b, (bn_w, bn_b, mean, var), eps, None)


def _fold(rw: Rewriter, op: Node, x: Node, w_node: Node, b: Node | None,
          bn: tuple[Any, Any, Node, Node], eps: float, conv_args: tuple[Any, ...] | None
          ) -> Node:
    """``bn``: the batch norm's operands (``_BN_PARAMS``); ``conv_args``: the convolution's
    geometry (``_CONV_ARGS``), None for a linear."""
    from torch.nn.utils.fusion import fuse_linear_bn_weights

    weight, bias = rw.tensor(w_node), _tensor(rw, b)
    mean, var = rw.tensor(bn[2]), rw.tensor(bn[3])
    bn_w, bn_b = _tensor(rw, bn[0]), _tensor(rw, bn[1])
    if conv_args is not None:
        fused_w, fused_b = fold_conv_bn(weight, bias, mean, var, eps, bn_w, bn_b,
                                        bool(conv_args[3]), int(conv_args[5]))
    else:
        # (an absent affine part only where Needs.optional_affine lets it through)
        fused_w, fused_b = fuse_linear_bn_weights(
            weight, bias, mean, var, eps, torch.ones_like(mean) if bn_w is None else bn_w,
            torch.zeros_like(mean) if bn_b is None else bn_b)
    w_name, b_name = folded_names(w_node.name, None if b is None else b.name)
    w_new = rw.fresh_constant(w_name, fused_w.detach())
    b_new = rw.fresh_constant(b_name, fused_b.detach())
    # where the source weight was, graph and signature, as the stock passes place them
    # (the Vulkan serializer numbers values in placeholder order)
    rw.move_before(w_new, w_node)
    rw.move_before(b_new, w_node)
    rw.insert_at(op)  # where the stock passes leave the rewritten conv / linear
    if conv_args is not None:
        new = rw.call(CONV, x, w_new, b_new, *conv_args)
    else:
        new = rw.call(LINEAR, x, w_new, b_new)
    keep_provenance(new, op)  # the stock passes edit the conv / linear in place
    return _reroute(rw, new)


def fold_standalone(rw: Rewriter, x: Node, bn_w: Any, bn_b: Any, mean: Node, var: Node,
                    eps: float) -> Node:
    """The replacement of ``batch_norm_as_conv``: a 1x1 depthwise convolution of ones with
    the batch norm folded in (what Arm's pass inserts where no convolution precedes it)."""
    rank = rw.root.meta["val"][0].dim()
    m = rw.tensor(mean)
    ones = torch.ones((1,) * rank, dtype=m.dtype)
    fused_w, fused_b = fold_conv_bn(ones, None, m, rw.tensor(var), eps, _tensor(rw, bn_w),
                                    _tensor(rw, bn_b), False, 1)
    # named as Arm's pass names the fold of the ones-weight it inserts, and put where it
    # puts them: before the batch norm's weight (first of the placeholders without one)
    w_name, b_name = folded_names(f"{rw.root.name}_conv_weight", None)
    w_new = rw.fresh_constant(w_name, fused_w.detach())
    b_new = rw.fresh_constant(b_name, fused_b.detach())
    anchor = bn_w if isinstance(bn_w, Node) else rw.placeholders()[0]
    rw.move_before(w_new, anchor)
    rw.move_before(b_new, anchor)
    d = rank - 2
    new = rw.call(CONV, x, w_new, b_new, [1] * d, [0] * d, [1] * d, False, [0] * d,
                  int(fused_w.shape[0]))
    return _reroute(rw, new)


def _output_only(ctx: CheckContext, bn: Node) -> str | None:
    """The stock passes' rule: every user reads the normalized tensor, not the statistics."""
    for u in bn.users:
        if not (u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0):
            return (f"`{u.name}` reads more of batch norm `{bn.name}` than its output tensor "
                    "(getitem 0): the statistics are not computed once it is folded")
    return None


def _optional_constant(ctx: CheckContext, v: Any, label: str) -> MatchResult | None:
    """None when ``v`` is absent (None) or a constant tensor; else why not, blamed on it."""
    if v is None or (isinstance(v, Node) and ctx.inputs.constant(v) is not None):
        return None
    if isinstance(v, Node):
        return ctx.fail(f"{label} `{v.name}` is {ctx.inputs.describe(v)}, not a constant: "
                        f"{FOLD_ROLE}", at=v)
    return ctx.fail(f"{label} is the literal {v!r}, not a constant tensor: {FOLD_ROLE}",
                    at=ctx.root)


def _bias_constant(ctx: CheckContext, b: Node | None = None) -> MatchResult | None:
    """A bias, when there is one, is folded too: it must be a constant."""
    return _optional_constant(ctx, b, "bias")


def _affine_constant(ctx: CheckContext, bn_w: Any = None, bn_b: Any = None
                     ) -> MatchResult | None:
    """The batch norm's weight and bias, when present, are folded: constants."""
    return (_optional_constant(ctx, bn_w, "batch-norm weight")
            or _optional_constant(ctx, bn_b, "batch-norm bias"))


def _bn_output(bn: Node) -> torch.Tensor | None:
    out = bn.meta.get("val")
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out if isinstance(out, torch.Tensor) and out.dim() >= 2 else None


def _off_channels(out: torch.Tensor, mean: Node, var: Node, bn_w: Any, bn_b: Any,
                  dtype: torch.dtype | None = None) -> tuple[str, Any, Any] | None:
    """The first of the batch norm's statistics and affine part (when present) that is not
    a vector over the C channels of ``out`` (of ``dtype``, when given): its label, the
    operand and its value; None when every one is."""
    c = out.shape[1]
    for label, v in (("running mean", mean), ("running variance", var),
                     ("batch-norm weight", bn_w), ("batch-norm bias", bn_b)):
        t = v.meta.get("val") if isinstance(v, Node) else None
        if v is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != c
                              or (dtype is not None and t.dtype != dtype)):
            return label, v, t
    return None


def _folded_shapes(ctx: CheckContext, bn: Node, mean: Node, var: Node, bn_w: Any = None,
                   bn_b: Any = None) -> str | None:
    """The batch norm's statistics and affine part are vectors of its dtype over the C
    channels it normalizes."""
    out = _bn_output(bn)
    if out is None:
        return f"batch norm `{bn.name}` has no known output of rank 2 or more"
    off = _off_channels(out, mean, var, bn_w, bn_b, out.dtype)
    if off is None:
        return None
    label, v, _ = off
    return (f"{label} `{getattr(v, 'name', v)}` is not a {out.dtype} vector of the "
            f"{out.shape[1]} channels batch norm `{bn.name}` normalizes")


def _statistics_per_channel(ctx: CheckContext, bn: Node, mean: Node, var: Node,
                            bn_w: Any = None, bn_b: Any = None) -> str | None:
    """The batch norm's statistics and affine part are vectors over the C channels it
    normalizes (any dtype). Eager ``native_batch_norm`` does not check their length: a
    running variance of one element for two channels reads past its end, while the fold
    broadcasts it (found by ``fusionkit verify``)."""
    out = _bn_output(bn)
    if out is None:
        return f"batch norm `{bn.name}` has no known output of rank 2 or more"
    off = _off_channels(out, mean, var, bn_w, bn_b)
    if off is None:
        return None
    label, v, t = off
    return (f"{label} `{getattr(v, 'name', v)}` of shape "
            f"{tuple(getattr(t, 'shape', ()))} is not a vector of the {out.shape[1]} channels "
            f"batch norm `{bn.name}` normalizes")


def _folded_weight(ctx: CheckContext, bn: Node, w: Node, b: Any = None) -> str | None:
    """The conv / linear weight and bias are of the dtype the batch norm computes in; the
    bias a vector over its channels."""
    out = _bn_output(bn)
    if out is None:
        return f"batch norm `{bn.name}` has no known output of rank 2 or more"
    t = w.meta.get("val")
    if not isinstance(t, torch.Tensor) or t.dtype != out.dtype:
        return f"weight `{w.name}` is not {out.dtype}, the dtype batch norm `{bn.name}` computes in"
    bt = b.meta.get("val") if isinstance(b, Node) else None
    if b is not None and (not isinstance(bt, torch.Tensor) or bt.dtype != out.dtype
                          or tuple(bt.shape) != (out.shape[1],)):
        return f"bias `{getattr(b, 'name', b)}` is not a {out.dtype} vector of {out.shape[1]}"
    return None


def _constraints(needs: Needs, with_op: bool) -> list[Any]:
    out: list[Any] = [constraint("batch_norm_output_only")(_output_only)]
    folded = ("mean", "var") if needs.optional_affine else _BN_PARAMS
    if with_op:
        folded = ("w", *folded)
    out += [PrepackableConstant(n, role=FOLD_ROLE) for n in folded]
    if needs.optional_affine:
        out.append(constraint("optional_affine_is_constant", hints={"bn_w": OperandHint(constant=True), "bn_b": OperandHint(constant=True)})(_affine_constant))
    if with_op:
        out.append(constraint("optional_bias_is_constant")(_bias_constant))
    if needs.dtypes is not None:  # the batch norm's statistics decide the dtype it computes in
        out += [DtypeIn("mean", needs.dtypes),
                constraint("folded_statistics_shapes")(_folded_shapes)]
        if with_op:
            out.append(constraint("folded_weight_dtype")(_folded_weight))
    else:
        out.append(constraint("statistics_per_channel")(_statistics_per_channel))
    return out


def rules(needs: Needs) -> list[Rule]:
    """The family's rules for one backend: conv -> batch norm (and linear -> batch norm,
    and the standalone batch norm, as ``needs`` says), folded."""
    out = [Rule(
        name=f"{needs.prefix}conv_batch_norm",
        pattern=_conv_pattern(),
        constraints=[*_constraints(needs, True), Rank("x", needs.conv_ranks)],
        replacement=PythonReplacement(fold_conv),
        description="a convolution's inference batch norm folded into its weight and bias",
    )]
    if needs.linear:
        out.append(Rule(
            name=f"{needs.prefix}linear_batch_norm",
            pattern=_linear_pattern(),
            # a batch norm normalizes dim 1: only over a 2-D linear output is that the
            # linear's features (over (N, L, F) it is L, which the fold would scale as F)
            constraints=[*_constraints(needs, True), Rank("x", frozenset({2}))],
            replacement=PythonReplacement(fold_linear),
            description="a linear's inference batch norm folded into its weight and bias",
        ))
    if needs.standalone:
        out.append(Rule(
            name=f"{needs.prefix}batch_norm_as_conv",
            pattern=_batch_norm(capture("x")),
            constraints=[*_constraints(needs, False), Rank("x", needs.conv_ranks)],
            replacement=PythonReplacement(fold_standalone),
            description="an inference batch norm with no convolution to fold into, as a "
                        "1x1 depthwise convolution with the batch norm folded in",
        ))
    return out
