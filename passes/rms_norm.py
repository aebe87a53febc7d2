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

from collections.abc import Iterable

import torch

from fusionkit import (
    CASTS,
    Constraint,
    DtypeIn,
    PrepackableConstant,
    ReducesLastDim,
    Rule,
    SameDtype,
    broadcasts_over_last_dim,
    capture,
    int_list,
    op,
    ref,
    replace_with,
    scalar,
    through,
)
from fusionkit.passes.registry import register_rules

RMS_NORM_TARGET = "et_vk.rms_norm.default"

#: dtypes ExecuTorch's Vulkan backend runs et_vk.rms_norm in (``utils.FP_T`` in 1.5.1)
VULKAN_DTYPES: frozenset[torch.dtype] = frozenset({torch.float32, torch.float16})


@register_rules("vulkan_patterns")
def rms_norm_rule(name: str = "rms_norm", fold: bool = True,
                  dtypes: Iterable[torch.dtype] | None = None) -> Rule:
    """The RMSNorm fusion rule.

    ``fold``: accept a weight computed only from constants (folded into a new
    constant). ``dtypes``: if given, only fuse norms whose input ``x`` has one of
    these dtypes — a backend adapter passes the dtypes its kernel supports, so
    that no fused op is created that the partitioner would then leave undelegated
    (et_vk ops have no CPU kernel in the ExecuTorch runtime).
    """
    x = through(CASTS, capture("x"))
    square = op("aten.mul.Tensor", x, x) | op("aten.pow.Tensor_Scalar", x, 2)
    mean = op("aten.mean.dim", square, int_list(1, name="dim"), True)
    # a literal, or the 0-d constant the edge dialect lifts it into; in fp16/bf16
    # graphs that lifted fp32 constant is cast to the activations' dtype first
    # (narrowing: the fused op takes eps as a float and adds it in its own precision)
    eps = through(CASTS, scalar("eps", lo=0.0), narrowing=True)
    variance = op("aten.add.Tensor", mean, eps) | op("aten.add.Scalar", mean, eps)
    normed = op("aten.mul.Tensor", x, op("aten.rsqrt.default", variance))
    # HF norms compute in fp32 and cast the result back to the activations' dtype:
    # that narrowing cast is part of what the fused op (computing in x's dtype) replaces
    root = op("aten.mul.Tensor", through(CASTS, normed, narrowing=True),
              capture("weight")).bind("out")
    constraints: list[Constraint] = [
        ReducesLastDim("dim", "x"),
        PrepackableConstant("weight", fold=fold,
                            role="et_vk.rms_norm prepacks its weight"),
        SameDtype("out", "x"),
        SameDtype("weight", "x"),
        broadcasts_over_last_dim("weight", "x"),
    ]
    if dtypes is not None:
        constraints.insert(0, DtypeIn("x", frozenset(dtypes)))
    return Rule(
        name=name,
        pattern=root,
        constraints=constraints,
        replacement=replace_with(RMS_NORM_TARGET, ref("x"), ref("weight"), ref("eps")),
        description="decomposed RMSNorm times a constant weight into et_vk.rms_norm",
    )
