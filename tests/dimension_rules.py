"""Held-out rules that mix up dimensions, drop an operand or get a constant wrong, each
with its right twin (``tests/test_verify_trust.py``): written for the test, never shipped.

Each wrong rule computes what its pattern computes on some shapes only: on a size-1 dim,
on a square or cube shape (its output shape differs elsewhere, and the rewrite declines),
or where two dims happen to be equal. A verifier whose draws lean on size-1 dims, or
never give two dims different sizes greater than one, judges them equal.
"""

from __future__ import annotations

from typing import Any

import torch

from fusionkit import (
    DtypeIn,
    PythonReplacement,
    Rank,
    Rule,
    capture,
    lit,
    op,
    ref,
    replace_with,
    scalar,
)

X, Y, Z = capture("x"), capture("y"), capture("z")
F32 = DtypeIn("x", {torch.float32})


def _size(x: Any, dim: int) -> int:
    return int(x.meta["val"].shape[dim])


def sum_normalize(dim: int) -> Rule:
    """``x / sum(x, -1, keepdim)`` -> the same over ``dim`` (-2 is wrong)."""
    pattern = op("aten.div.Tensor", X, op("aten.sum.dim_IntList", X, lit([-1]), lit(True)))

    def fused(rw: Any, x: Any) -> Any:
        return rw.call("aten.div.Tensor", x, rw.call("aten.sum.dim_IntList", x, [dim], True))

    return Rule(f"sum_normalize_over_{-dim}", pattern, PythonReplacement(fused), [F32, Rank("x", {2, 3, 4})])


def softmax(dim: int) -> Rule:
    """``exp(x) / sum(exp(x), -1, keepdim)`` -> ``_softmax(x, dim)`` (-2 is wrong)."""
    e = op("aten.exp.default", X).bind("e")
    pattern = op("aten.div.Tensor", e, op("aten.sum.dim_IntList", e, lit([-1]), lit(True)))
    return Rule(f"softmax_over_{-dim}", pattern, replace_with("aten._softmax.default", ref("x"), dim, False),
                [F32, Rank("x", {2, 3, 4})])


def mean(sum_dim: int, count_dim: int) -> Rule:
    """``mean(x, [-1])`` -> ``sum(x, [sum_dim]) / x.shape[count_dim]``: right with -1, -1; a
    sum over -2 keeps the shape only on squares; a count of dim -2 is right only on squares."""
    pattern = op("aten.mean.dim", X, lit([-1]))

    def fused(rw: Any, x: Any) -> Any:
        return rw.call("aten.div.Tensor", rw.call("aten.sum.dim_IntList", x, [sum_dim]), _size(x, count_dim))

    return Rule(f"mean_sum{-sum_dim}_count{-count_dim}", pattern, PythonReplacement(fused),
                [F32, Rank("x", {2, 3, 4})])


def rms_norm(dim: int) -> Rule:
    """``x * rsqrt(mean(x * x, [-1], keepdim) + eps)`` -> the same over ``dim``."""
    sq = op("aten.mul.Tensor", X, X)
    pattern = op("aten.mul.Tensor", X, op("aten.rsqrt.default", op(
        "aten.add.Tensor", op("aten.mean.dim", sq, lit([-1]), lit(True)), scalar("eps", lo=1e-6, hi=1e-5))))

    def fused(rw: Any, x: Any, eps: Any) -> Any:
        ms = rw.call("aten.mean.dim", rw.call("aten.mul.Tensor", x, x), [dim], True)
        return rw.call("aten.mul.Tensor", x, rw.call("aten.rsqrt.default", rw.call("aten.add.Tensor", ms, eps)))

    return Rule(f"rms_norm_over_{-dim}", pattern, PythonReplacement(fused), [F32, Rank("x", {2, 3, 4})])


def transpose(dims: list[int]) -> Rule:
    """``transpose(x, 1, 2)`` of a rank-3 x -> ``permute_copy(x, dims)`` ([0, 2, 1] is right,
    [1, 0, 2] swaps the wrong pair: the same shape only on cubes)."""
    pattern = op("aten.transpose.int", X, lit(1), lit(2))
    return Rule(f"transpose_as_permute_{''.join(map(str, dims))}", pattern,
                replace_with("aten.permute_copy.default", ref("x"), dims), [F32, Rank("x", {3})])


def view_as_transpose(right: bool) -> Rule:
    """``permute_copy(x, [1, 0])`` of a 2-D x -> the transpose (right), or a view to the
    transposed sizes (wrong: equal only where a dim is 1)."""
    pattern = op("aten.permute_copy.default", X, lit([1, 0]))

    def fused(rw: Any, x: Any) -> Any:
        if right:
            return rw.call("aten.transpose_copy.int", x, 0, 1)
        return rw.call("aten.view_copy.default", x, [_size(x, 1), _size(x, 0)])

    return Rule("transpose_as_view" if not right else "transpose_as_transpose", pattern,
                PythonReplacement(fused), [F32, Rank("x", {2})])


def multiply_add(drop: bool) -> Rule:
    """``x * y + z`` -> ``addcmul(z, x, y)``; dropped: ``x * y``."""
    pattern = op("aten.add.Tensor", op("aten.mul.Tensor", X, Y), Z)
    constraints = [F32, DtypeIn("y", {torch.float32}), DtypeIn("z", {torch.float32})]
    if drop:
        return Rule("multiply_add_dropped_z", pattern, replace_with("aten.mul.Tensor", ref("x"), ref("y")),
                    constraints)
    return Rule("multiply_add", pattern, replace_with("aten.addcmul.default", ref("z"), ref("x"), ref("y")),
                constraints)


def hardsigmoid(offset: float) -> Rule:
    """``clamp(x + 3, 0, 6) / 6`` -> ``hardsigmoid(x)`` (offset 3) or with another offset."""
    pattern = op("aten.div.Tensor", op("aten.clamp.default", op("aten.add.Tensor", X, lit(3.0)),
                                       lit(0.0), lit(6.0)), lit(6.0))
    if offset == 3.0:
        return Rule("hardsigmoid", pattern, replace_with("aten.hardsigmoid.default", ref("x")), [F32])

    def fused(rw: Any, x: Any) -> Any:
        shifted = rw.call("aten.clamp.default", rw.call("aten.add.Tensor", x, offset), 0.0, 6.0)
        return rw.call("aten.div.Tensor", shifted, 6.0)

    return Rule("hardsigmoid_wrong_offset", pattern, PythonReplacement(fused), [F32])


#: (wrong rule, its right twin), by what the wrong one gets wrong
PAIRS: dict[str, tuple[Rule, Rule]] = {
    "sum over dim -2": (sum_normalize(-2), sum_normalize(-1)),
    "softmax over dim -2": (softmax(-2), softmax(-1)),
    "mean summed over dim -2": (mean(-2, -1), mean(-1, -1)),
    "mean counting dim -2": (mean(-1, -2), mean(-1, -1)),
    "rms norm over dim -2": (rms_norm(-2), rms_norm(-1)),
    "transpose of the wrong pair": (transpose([1, 0, 2]), transpose([0, 2, 1])),
    "a view for a transpose": (view_as_transpose(False), view_as_transpose(True)),
    "a dropped operand": (multiply_add(True), multiply_add(False)),
    "a wrong constant": (hardsigmoid(2.0), hardsigmoid(3.0)),
}
