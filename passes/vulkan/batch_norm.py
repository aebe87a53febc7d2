"""Fold an inference batch norm into the convolution or linear before it.

Replaces ``FuseBatchNormPass`` (``executorch/backends/xnnpack/_passes/fuse_batch_norm.py``,
which ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1 runs) as a rule:
``batch_norm(conv_or_linear(x, w, b, ...), bn_w, bn_b, mean, var, ..., eps)``, read
through ``getitem(., 0)`` only, -> ``conv_or_linear(x, w', b', ...)`` (the getitems read
it instead) with ``w', b'`` from torch's own
``fuse_conv_bn_weights`` / ``fuse_linear_bn_weights`` (the stock pass's functions, so
the folded bytes are the same).

What the stock pass checks inline, stated as constraints: the conv/linear has one user,
the batch norm (the pattern: an intermediate is used only inside the match), the batch
norm only ``getitem(., 0)`` users (a constraint), the conv/linear weight and the batch-norm
weight are constants, a convolution's input is rank 3 or 4. What it forgets, declined
here before anything changes: the batch-norm bias, running mean and variance and the
conv/linear bias must be constants too (the stock pass reads them with
``get_param_tensor``, which raises for a user input and kills the lowering); a
``native_batch_norm`` in training mode normalizes with batch statistics, so folding the
running statistics would change the values (the stock pass folds it anyway).

Fixed as well: the stock pass names the folded weight after the source weight only, so
two convolutions sharing a weight, each with its own batch norm, both get the first
one's folded weight (``create_constant_placeholder`` returns the existing node for a
known name). Here the folded constants are named per match. The stock pass ends
with an ExportPass retrace (which fails on a partition without fake-tensor inputs:
mixed fake modes); the rule rewrites in place, with exact metadata, so that failure
is no longer in this step (the later retracing passes still have it; the adapter's
constant folding before partitioning is what avoids it).

The folded constants are placed where the source weight was (graph and signature), as
the stock pass places them: the Vulkan serializer numbers values in placeholder order,
so this keeps the payload byte-identical. (The source constants stay in the program,
unused, as the stock pass leaves them: the adapter's ``RulePass`` keeps dead constants
for this pass.)
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from torch.export.graph_signature import ExportGraphSignature, OutputSpec, TensorArgument
from torch.fx import Node

from fusionkit import (
    CheckContext,
    MatchResult,
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
from fusionkit.passes._provenance import keep_provenance
from fusionkit.passes.registry import register_rules

from ._common import constraint, optional_constant

CONV = "aten.convolution.default"
LINEAR = "aten.linear.default"
BN_NO_TRAINING = "aten._native_batch_norm_legit_no_training.default"
BN = "aten.native_batch_norm.default"

#: stock pass -> the rules replacing it (``takes_over`` of the factory below)
STOCK_PASS = "FuseBatchNormPass"

_CONV_ARGS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")
_BN_PARAMS = ("bn_w", "bn_b", "mean", "var")


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


def _move_before(rw: Rewriter, new: Node, anchor: Node) -> None:
    """Put placeholder ``new`` (and its signature entry) right before ``anchor``."""
    assert rw.ep is not None
    specs = rw.ep.graph_signature.input_specs  # the list itself: node and spec move together
    names = [getattr(s.arg, "name", None) for s in specs]
    if new.name not in names or anchor.name not in names:
        return
    spec = specs.pop(names.index(new.name))
    specs.insert([getattr(s.arg, "name", None) for s in specs].index(anchor.name), spec)
    anchor.prepend(new)


def fold_conv_batch_norm(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Node, bn_b: Node,
                         mean: Node, var: Node, eps: float, stride: Any, padding: Any,
                         dilation: Any, transposed: Any, output_padding: Any, groups: Any,
                         b: Node | None = None) -> Node:
    """The replacement of ``conv_batch_norm``: the convolution ``op`` with folded weight and bias."""
    return _fold(rw, op, x, w, b, (bn_w, bn_b, mean, var), eps,
                 (stride, padding, dilation, transposed, output_padding, groups))


def fold_linear_batch_norm(rw: Rewriter, op: Node, x: Node, w: Node, bn_w: Node, bn_b: Node,
                           mean: Node, var: Node, eps: float, b: Node | None = None) -> Node:
    """The replacement of ``linear_batch_norm``: the linear ``op`` with folded weight and bias."""
    return _fold(rw, op, x, w, b, (bn_w, bn_b, mean, var), eps, None)


def _fold(rw: Rewriter, op: Node, x: Node, w_node: Node, b: Node | None,
          bn: tuple[Node, Node, Node, Node], eps: float, conv_args: tuple[Any, ...] | None
          ) -> Node:
    """``bn``: the batch norm's operands (``_BN_PARAMS``); ``conv_args``: the convolution's
    geometry (``_CONV_ARGS``), None for a linear."""
    from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

    weight = rw.tensor(w_node)
    bias = rw.tensor(b) if isinstance(b, Node) else None
    mean, var = rw.tensor(bn[2]), rw.tensor(bn[3])
    bn_w, bn_b = rw.tensor(bn[0]), rw.tensor(bn[1])
    if conv_args is not None:
        transposed = conv_args[_CONV_ARGS.index("transposed")]
        fused_w, fused_b = fuse_conv_bn_weights(weight, bias, mean, var, eps, bn_w, bn_b,
                                                bool(transposed))
    else:
        fused_w, fused_b = fuse_linear_bn_weights(weight, bias, mean, var, eps, bn_w, bn_b)
    # named per match: two layers sharing a weight get their own folded copies
    tag = f"fusionkit_{rw.root.name}_bn_fused"
    w_new = rw.constant(f"{tag}_weight", fused_w.detach())
    b_new = rw.constant(f"{tag}_bias", fused_b.detach())
    _move_before(rw, w_new, w_node)
    _move_before(rw, b_new, w_node)
    if op.graph is rw.graph:  # (a probe builds into a scratch graph)
        rw.insert_before = op  # where the stock pass leaves the rewritten conv / linear
    if conv_args is not None:
        new = rw.call(CONV, x, w_new, b_new, *conv_args)
    else:
        new = rw.call(LINEAR, x, w_new, b_new)
    keep_provenance(new, op)  # the stock pass edits the conv / linear in place
    # the batch norm's output tensor is what its getitem(., 0) users read (the constraint):
    # they read the folded op instead and go (the journal sees both changes). Patterns
    # name operator overloads, not getitem, so the match's root is the batch norm, whose
    # tuple nothing reads now: it stands for itself and is erased with the claimed nodes
    renamed = {}
    for item in list(rw.root.users):
        item.replace_all_uses_with(new)
        renamed[item.name] = new.name
        rw.graph.erase_node(item)
    if renamed and rw.ep is not None and rw.graph is rw.ep.graph_module.graph:
        _rename_outputs(rw.ep, renamed)
    return rw.root


def _rename_outputs(ep: Any, renamed: Mapping[str, str]) -> None:
    """A getitem that was a program output: its output spec names the folded op now.

    (The constants added above made the journal snapshot the signature first, so an
    undone match restores it.)"""
    sig = ep.graph_signature
    if not any(getattr(s.arg, "name", None) in renamed for s in sig.output_specs):
        return
    outs = [OutputSpec(s.kind, TensorArgument(renamed[s.arg.name]), s.target)
            if getattr(s.arg, "name", None) in renamed else s for s in sig.output_specs]
    ep._graph_signature = ExportGraphSignature(sig.input_specs, outs)


def _output_only(ctx: CheckContext, bn: Node) -> str | None:
    """The stock pass's rule: every user reads the normalized tensor, not the statistics."""
    for u in bn.users:
        if not (u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0):
            return (f"`{u.name}` reads more of batch norm `{bn.name}` than its output tensor "
                    "(getitem 0): the statistics are not computed once it is folded")
    return None


#: why every operand of the batch norm and the conv / linear weight must be constants
FOLD_ROLE = "its value is folded into the new weight and bias at lowering time"


def _bias_constant(ctx: CheckContext, b: Node | None = None) -> MatchResult | None:
    """A bias, when there is one, is folded too: it must be a constant."""
    return optional_constant(ctx, b, "bias", FOLD_ROLE)


def _constants() -> list[Any]:
    return [constraint("batch_norm_output_only")(_output_only),
            *(PrepackableConstant(n, role=FOLD_ROLE) for n in ("w", *_BN_PARAMS)),
            constraint("optional_bias_is_constant")(_bias_constant)]


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def batch_norm_rules() -> list[Rule]:
    """conv -> batch norm and linear -> batch norm, folded into the conv / linear."""
    return [
        Rule(
            name="conv_batch_norm",
            pattern=_conv_pattern(),
            constraints=[*_constants(), Rank("x", frozenset({3, 4}))],
            replacement=PythonReplacement(fold_conv_batch_norm),
            description="a convolution's inference batch norm folded into its weight and bias",
        ),
        Rule(
            name="linear_batch_norm",
            pattern=_linear_pattern(),
            constraints=_constants(),
            replacement=PythonReplacement(fold_linear_batch_norm),
            description="a linear's inference batch norm folded into its weight and bias",
        ),
    ]


__all__ = ["FOLD_ROLE", "STOCK_PASS", "batch_norm_rules", "fold_conv_batch_norm",
           "fold_linear_batch_norm"]
