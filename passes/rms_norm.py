"""RMSNorm × weight → ``et_vk.rms_norm(x, weight, eps)``, written with the DSL.

Matches the decomposed norm as model code writes it — ``x*x`` or ``x**2``,
``mean`` over the last dim with keepdim, ``+ eps`` (a literal, or the 0-d
constant the edge dialect lifts it into), ``rsqrt``, times ``x``, operands in
any order, dtype casts around the norm — followed by the multiply with the
weight. The fused op *prepacks* its weight, so the weight must be a constant;
one computed only from constants (a cast, Gemma's ``1.0 + weight``) is folded
into a new constant, anything depending on an input is declined.
"""

from __future__ import annotations

from fusionkit import (
    CASTS,
    BroadcastsOverLastDim,
    PrepackableConstant,
    ReducesLastDim,
    Rule,
    SameDtype,
    capture,
    int_list,
    op,
    ref,
    replace_with,
    scalar,
    through,
)

RMS_NORM_TARGET = "et_vk.rms_norm.default"


def rms_norm_rule(name: str = "rms_norm", fold: bool = True) -> Rule:
    x = through(CASTS, capture("x"))
    square = op("aten.mul.Tensor", x, x) | op("aten.pow.Tensor_Scalar", x, 2)
    mean = op("aten.mean.dim", square, int_list(1, name="dim"), True)
    eps = scalar("eps", lo=0.0)
    variance = op("aten.add.Tensor", mean, eps) | op("aten.add.Scalar", mean, eps)
    normed = op("aten.mul.Tensor", x, op("aten.rsqrt.default", variance))
    root = op("aten.mul.Tensor", through(CASTS, normed), capture("weight")).bind("out")
    return Rule(
        name=name,
        pattern=root,
        constraints=[
            ReducesLastDim("dim", "x"),
            PrepackableConstant("weight", fold=fold,
                                role="et_vk.rms_norm prepacks its weight"),
            SameDtype("out", "x"),
            SameDtype("weight", "x"),
            BroadcastsOverLastDim("weight", "x"),
        ],
        replacement=replace_with(RMS_NORM_TARGET, ref("x"), ref("weight"), ref("eps")),
        description="decomposed RMSNorm times a constant weight into et_vk.rms_norm",
    )
