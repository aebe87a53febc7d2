"""A batch norm no convolution or linear absorbed -> a 1x1 depthwise convolution.

Takes over ``DecomposeBatchNorm`` (``_passes/decompose_batch_norm.py``, ExecuTorch 1.5.1):
XNNPACK has no batch-norm operator, so an inference batch norm left after
``FuseBatchNormPass`` (after an add, a relu, an input...) becomes
``convolution(x, w, b, groups=C)`` with a ``[C, 1, 1(, 1)]`` weight
``gamma / sqrt(var + eps)`` and a bias ``beta - mean * gamma / sqrt(var + eps)``
(computed in float64, cast to the statistics' dtype, as the stock pass does, so the
bytes are the same). A rank-2 input (``BatchNorm1d`` on ``[N, C]``) is unsqueezed to
``[N, C, 1]`` for a 1-D convolution and squeezed back.

What the stock pass checks inline (``can_decompose_batch_norm``), stated as
constraints: input rank 2, 3 or 4; a statically known channel count; the batch norm
read only through ``getitem(., 0)``; weight and bias (when present), running mean and
variance constant; eps a number; ``native_batch_norm`` not in training mode (the
pattern: ``training`` must be the literal ``False``).

What it forgets:

- **Names.** It names the new constants after the batch-norm *weight* only
  (``<gamma>_decomposed_bn_weight``), and ``create_constant_placeholder`` returns the
  existing node for a known name. Two batch norms without an affine weight
  (``affine=False``: the name is ``_decomposed_bn_weight`` for both), or two sharing a
  weight, all get the first one's folded statistics: the second normalizes with the
  first's mean and variance. Here the constants are named per match.
- **dtype.** A batch norm whose input dtype differs from its statistics' (ATen allows a
  half input with float statistics) would become a convolution whose weight dtype is
  not its input's; declined.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, any_value, capture, lit, op
from fusionkit.passes.registry import register_rules

from ._common import CONV, constraint, is_dequantize
from ._getitem import read_through_getitems

BN_NO_TRAINING = "aten._native_batch_norm_legit_no_training.default"
BN = "aten.native_batch_norm.default"
UNSQUEEZE = "aten.unsqueeze_copy.default"
SQUEEZE = "aten.squeeze_copy.dim"

#: input ranks the stock pass decomposes: NC, NCL, NCHW (XNNPACK has no 3-D convolution)
RANKS = (2, 3, 4)


def _val(v: Any) -> Any:
    return v.meta.get("val") if isinstance(v, Node) else None


def _decomposable_input(ctx: CheckContext, x: Any, mean: Any) -> str | None:
    val, stats = _val(x), _val(mean)
    if not isinstance(val, torch.Tensor):
        return "the batch norm's input has no tensor value"
    if val.dim() not in RANKS:
        return (f"input rank {val.dim()}: XNNPACK convolves NC, NCL or NCHW only "
                "(a 3-D batch norm has no depthwise convolution)")
    if not isinstance(val.shape[1], int):
        return f"the channel count {val.shape[1]} is not static"
    if isinstance(stats, torch.Tensor) and stats.dtype != val.dtype:
        return (f"input is {val.dtype}, statistics {stats.dtype}: the convolution's weight "
                "would not have its input's dtype")
    if dequantized(x):
        return (f"input `{x.name}` is dequantized: XNNPACK would convolve its int8 tensor "
                "with a float weight (a lowering error, or a wrong result with none)")
    return None


def dequantized(x: Any) -> bool:
    """Whether ``x`` is a dequantize: XNNPACK reads the int8 tensor before it (the dq is
    implicit), so a float depthwise convolution after it is a mixed-precision one that
    XNNPACK's convolution cannot compute."""
    return is_dequantize(x)


def _output_only(ctx: CheckContext, bn: Node) -> Any:
    for u in bn.users:
        if not (u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0):
            return ctx.fail(f"`{u.name}` reads more of batch norm `{bn.name}` than its output "
                            "tensor (getitem 0): the statistics are not computed once it is a "
                            "convolution", at="bn")
    return None


def _folded_operands_constant(ctx: CheckContext, mean: Any, var: Any, bn_w: Any = None,
                              bn_b: Any = None) -> Any:
    named = {"mean": mean, "var": var, "bn_w": bn_w, "bn_b": bn_b}
    for name, v in named.items():
        if v is None:
            continue  # no affine weight / bias: gamma = 1, beta = 0
        if not isinstance(v, Node) or ctx.inputs.constant(v) is None:
            what = ctx.inputs.describe(v) if isinstance(v, Node) else repr(v)
            return ctx.fail(f"batch-norm {name} `{getattr(v, 'name', v)}` is {what}, not a "
                            "constant: it is folded into the convolution at lowering time",
                            at=name)
    return None


def _static_eps(ctx: CheckContext, eps: Any) -> str | None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return f"eps {eps!r} is not a number known at lowering time"
    return None


def weight_and_bias(eps: float, mean: torch.Tensor, var: torch.Tensor,
                    gamma: torch.Tensor | None, beta: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel scale and shift of a frozen batch norm, as the stock pass computes
    them (float64, eps as a float32 tensor, cast back to the statistics' dtype): the
    same bytes."""
    g = gamma.double() if gamma is not None else torch.tensor([1.0], dtype=torch.float64)
    b = beta.double() if beta is not None else torch.tensor([0.0], dtype=torch.float64)
    denom = torch.sqrt(var.double() + torch.tensor([eps], dtype=torch.float32))
    scale = g / denom
    shift = -mean.double() * g / denom + b
    return scale.to(mean.dtype), shift.to(mean.dtype)


def _depthwise_conv(rw: Rewriter, bn: Node, x: Node, mean: Node, var: Node, eps: Any,
                    bn_w: Node | None = None, bn_b: Node | None = None) -> Node:
    val = x.meta["val"]
    channels, rank = int(val.shape[1]), val.dim()
    spatial = max(rank - 2, 1)  # NC is convolved as NCL with L = 1
    scale, shift = weight_and_bias(
        eps, rw.tensor(mean), rw.tensor(var),
        rw.tensor(bn_w) if bn_w is not None else None,
        rw.tensor(bn_b) if bn_b is not None else None)
    tag = f"fusionkit_{bn.name}_decomposed_bn"  # per match: see the module docstring
    weight = rw.constant(f"{tag}_weight", scale.reshape([channels, 1] + [1] * spatial))
    bias = rw.constant(f"{tag}_bias", shift)
    rw.insert_at(bn)  # where the stock pass puts the convolution
    inp = rw.call(UNSQUEEZE, x, 2) if rank == 2 else x
    conv = rw.call(CONV, inp, weight, bias, [1] * spatial, [0] * spatial, [1] * spatial,
                   False, [0] * spatial, channels)
    out = rw.call(SQUEEZE, conv, 2) if rank == 2 else conv
    for n in rw.created:
        if n.op == "call_function":
            # the stock pass creates these nodes bare: no debug handle of the batch norm's
            # reaches the payload (keep_provenance's keys, minus what stock does not copy)
            n.meta.pop("debug_handle", None)
    return read_through_getitems(rw, out)  # the getitem(., 0) readers read `out`


def _pattern() -> Any:
    stats = (lit(None) | capture("bn_w"), lit(None) | capture("bn_b"), capture("mean"),
             capture("var"))
    legit = op(BN_NO_TRAINING, capture("x"), *stats, any_value("momentum"), capture("eps"))
    # training=True normalizes with batch statistics: not a fixed convolution
    native = op(BN, capture("x"), *stats, lit(False), any_value("momentum"), capture("eps"))
    return (legit | native).bind("bn")


@register_rules("xnnpack", takes_over="DecomposeBatchNorm")
def decompose_batch_norm_rule() -> Rule:
    return Rule(
        name="xnnpack_decompose_batch_norm",
        pattern=_pattern(),
        constraints=[constraint("decomposable_input")(_decomposable_input),
                     constraint("batch_norm_output_only")(_output_only),
                     constraint("folded_operands_constant")(_folded_operands_constant),
                     constraint("static_eps")(_static_eps)],
        replacement=PythonReplacement(_depthwise_conv),
        description="inference batch norm as a 1x1 depthwise convolution",
    )


__all__ = ["decompose_batch_norm_rule", "dequantized", "weight_and_bias"]
