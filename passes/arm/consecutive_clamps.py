"""``clamp(clamp(x, a, b), c, d)`` -> ``clamp(x, max(a, c), min(b, d))``.

The range arithmetic and its checks are the clamp-chain family's
(:mod:`fusionkit.passes.families.clamp_chain`, shared with XNNPACK's activation fusion).

Takes over ``FuseConsecutiveClampsPass`` (``_passes/fuse_consecutive_clamps_pass.py``,
ExecuTorch 1.5.1), which runs after Arm's q/dq folding: ``ConvertToClampPass`` has made
every relu / hardtanh a clamp, so ``HardTanh -> ReLU`` is two adjacent clamps. The
composition is exact (a missing bound is -inf / +inf). The surviving clamp keeps the
second clamp's metadata (its output qparams) and takes the first one's input qparams,
as the stock pass leaves it.

Constraints: the first clamp has no other user (the match's escape check; stock counts
users too); both clamps' bounds are numbers or absent; the composed range is not empty
(stock leaves such a pair too: ``clamp`` with min > max is not associative); both clamps
compute in the same dtype (stock never looks: a clamp of an integer tensor after a cast
is no clamp of the cast's input).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.families.clamp_chain import compose, empty_reason, lower, not_numbers, upper

from ._common import (
    CLAMP,
    constraint,
    keep_node_meta,
    register_rules,  # (Arm's: its rules carry what the TOSA ops compute)
)


def _dtype(n: Node) -> torch.dtype | None:
    val = n.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _composable(ctx: CheckContext, first: Node, second: Node, lo1: Any, hi1: Any, lo2: Any,
                hi2: Any) -> str | None:
    bad = not_numbers(("min", lo1), ("max", hi1), ("min", lo2), ("max", hi2))
    if bad:
        return bad
    if compose(lo1, hi1, lo2, hi2) is None:
        return empty_reason(lo1, hi1, lo2, hi2)
    d1, d2 = _dtype(first), _dtype(second)
    if d1 is None or d1 != d2:
        return f"`{first.name}` computes in {d1}, `{second.name}` in {d2}"
    return None


def _fused(rw: Rewriter, first: Node, second: Node, x: Node, lo1: Any, hi1: Any, lo2: Any,
           hi2: Any) -> Node:
    rw.insert_at(second)  # where the surviving clamp is
    kwargs = {k: v for k, v in second.kwargs.items() if k not in ("min", "max")}
    new = rw.call(second.target, x, lower(lo1, lo2), upper(hi1, hi2), **kwargs)
    keep_node_meta(new, second)
    if first.meta.get("input_qparams") and "input_qparams" in second.meta:
        new.meta["input_qparams"] = dict(first.meta["input_qparams"])
    return new


@register_rules("arm", takes_over="FuseConsecutiveClampsPass")
def consecutive_clamps_rule() -> Rule:
    first = op(CLAMP, capture("x"), capture("lo1"), capture("hi1"),
               strict_defaults=False).bind("first")
    return Rule(
        name="arm_fuse_consecutive_clamps",
        pattern=op(CLAMP, first, capture("lo2"), capture("hi2"),
                   strict_defaults=False).bind("second"),
        constraints=[constraint("composable")(_composable)],
        replacement=PythonReplacement(_fused),
        description="two consecutive clamps as one with the intersected range",
    )


__all__ = ["consecutive_clamps_rule"]
