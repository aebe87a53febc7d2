"""ReLU / hardtanh after conv, linear, add, sub or mul -> that op's ``output_min/max``.

Takes over ``FuseActivationPass`` (``_passes/fuse_activation_pass.py``, ExecuTorch 1.5.1):
XNNPACK's conv, linear and binary nodes clamp their own output, so an activation
right after one is deleted and its range stored in the op's metadata
(``XNN_FUSED_ACTIVATION``), which the serializer writes as ``output_min/max``.

Constraints: the op's only user is the activation (the match's escape check; the
stock pass counts users too); hardtanh's bounds are numbers with ``min <= max``,
read by schema (defaults included). What the stock pass forgets: an op that already carries a fused activation. Its loop
visits ``relu`` then ``hardtanh`` of ``conv -> relu -> hardtanh`` and *overwrites*
the first range with the second, so the delegate computes ``clamp(conv, -1, 1)``
instead of ``clamp(conv, 0, 1)``. Here the ranges are intersected (and the match
declined when they do not overlap: the result would be a constant), with the clamp-chain
family's arithmetic (:mod:`fusionkit.passes.families.clamp_chain`, shared with Arm's
``FuseConsecutiveClampsPass``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, MatchResult, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.families.clamp_chain import compose
from fusionkit.passes.registry import OpSemantics, register_rules

from ._common import CONV, FUSED_ACTIVATION_TAG, LINEAR, constraint, keep_provenance

#: ``FuseActivationPass.FUSEABLE_OPS``
FUSEABLE_OPS: tuple[str, ...] = (CONV, "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor",
                                 LINEAR)

RELU = "aten.relu.default"
HARDTANH = "aten.hardtanh.default"


#: relu's range as the stock pass writes it
RELU_RANGE: tuple[Any, Any] = (0, "+inf")


def _bound(v: Any) -> Any:
    """An ``OutputMinMax`` bound as a number (``"+inf"`` / ``"-inf"``: infinities)."""
    return math.inf if v == "+inf" else -math.inf if v == "-inf" else v


def _kept(first: Any, second: Any, value: Any) -> Any:
    """Of two bounds, the one the family kept (``first`` on a tie), as it was written."""
    return first if _bound(first) == value else second


def _combined(old: Any, lo: Any, hi: Any) -> tuple[Any, Any] | None:
    """``clamp(clamp(x, old), lo, hi)`` as one range, None when it is a constant."""
    if old is None:
        return lo, hi
    rng = compose(_bound(old.output_min), _bound(old.output_max), _bound(lo), _bound(hi))
    if rng is None:
        return None
    return _kept(old.output_min, lo, rng[0]), _kept(old.output_max, hi, rng[1])


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _overlaps(pre: Node, lo: Any, hi: Any) -> str | None:
    """``pre``'s own fused range, if any, leaves something of [lo, hi]."""
    old = pre.meta.get(FUSED_ACTIVATION_TAG)
    if old is not None and _combined(old, lo, hi) is None:
        return (f"`{pre.name}` already clamps to [{old.output_min}, {old.output_max}], which "
                f"does not overlap [{lo}, {hi}]: the result is a constant")
    return None


def _relu_range(ctx: CheckContext, pre: Node) -> str | None:
    return _overlaps(pre, *RELU_RANGE)


def _hardtanh_range(ctx: CheckContext, pre: Node, lo: Any, hi: Any) -> str | MatchResult | None:
    # bounds that are no clamp range are the hardtanh's fault (they are its arguments)
    if not (_is_number(lo) and _is_number(hi)):
        return ctx.fail(f"hardtanh bounds ({lo!r}, {hi!r}) are not numbers", at=ctx.root)
    if lo > hi:
        return ctx.fail(f"hardtanh min_val {lo} > max_val {hi}: not a clamp range", at=ctx.root)
    return _overlaps(pre, lo, hi)


def _fused(rw: Rewriter, pre: Node, lo: Any, hi: Any) -> Node:
    """The same op with the range [lo, hi] (combined with one it already has)."""
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import OutputMinMax

    rng = _combined(pre.meta.get(FUSED_ACTIVATION_TAG), lo, hi)
    assert rng is not None  # the range checks declined the rest
    # where the stock pass leaves the op: ops computed between it and the
    # activation keep their place (the payload lists nodes in graph order)
    rw.insert_at(pre)
    node = rw.call(pre.target, *pre.args, **pre.kwargs)
    keep_provenance(node, pre)
    node.meta[FUSED_ACTIVATION_TAG] = OutputMinMax(*rng)
    return node


def _fused_relu(rw: Rewriter, pre: Node) -> Node:
    return _fused(rw, pre, *RELU_RANGE)


def _fused_hardtanh(rw: Rewriter, pre: Node, lo: Any, hi: Any) -> Node:
    return _fused(rw, pre, lo, hi)


def _fused_activation(recorded: Any, out: Any) -> Any:
    """XNNPACK's fused activation: the node's output clamped to ``[output_min, output_max]``
    (the operator serializers hand the bounds to XNNPACK's node)."""
    def bound(v: Any) -> float | None:
        if v is None or (isinstance(v, str) and v.lstrip("+-") == "inf"):
            return None
        return float(v)

    lo = bound(getattr(recorded, "output_min", None))
    hi = bound(getattr(recorded, "output_max", None))
    if not isinstance(out, torch.Tensor):
        return out
    if not out.is_floating_point():  # clamped in the output's own type (float bounds promote)
        return torch.clamp(out, None if lo is None else math.ceil(lo),
                           None if hi is None else math.floor(hi))
    return torch.clamp(out, lo, hi)


#: what the fused activation means, for fusionkit.verify
SEMANTICS = OpSemantics(metadata={FUSED_ACTIVATION_TAG: _fused_activation})


@register_rules("xnnpack", takes_over="FuseActivationPass", semantics=SEMANTICS)
def fuse_activation_rules() -> list[Rule]:
    """One rule per activation: ``relu(op(...))`` and ``hardtanh(op(...), lo, hi)``."""
    pre = op(FUSEABLE_OPS, capture("pre_input"), commutative=False,
             strict_defaults=False).bind("pre")
    return [
        Rule(name="xnnpack_fuse_relu", pattern=op(RELU, pre),
             replacement=PythonReplacement(_fused_relu),
             constraints=[constraint("fusable_range")(_relu_range)],
             description="relu after conv/linear/add/sub/mul into its output_min/max"),
        Rule(name="xnnpack_fuse_hardtanh",
             pattern=op(HARDTANH, pre, capture("lo"), capture("hi")),
             replacement=PythonReplacement(_fused_hardtanh),
             constraints=[constraint("fusable_range")(_hardtanh_range)],
             description="hardtanh after conv/linear/add/sub/mul into its output_min/max"),
    ]




