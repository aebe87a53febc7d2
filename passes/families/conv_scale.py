"""A convolution's output times a constant per-channel scale, folded into its weight and bias.

``conv(x, w, b, ...) * s`` -> ``conv(x, w * s, b * s, ...)`` where ``s`` is a number or a
constant float tensor that broadcasts over the convolution's output along the channel
dimension only (a scalar tensor, ``[C]`` aligned to the last dim is not: ``[C, 1, 1]`` or
``[1, C, 1, 1]`` is). What Arm's ``FoldScalarMulIntoConvPass`` (``executorch/backends/arm/
_passes/fold_scalar_mul_into_conv_pass.py``) does, stated as a rule: the convolution has
one user, the multiply (the pattern); it is not transposed (its weight's channel dimension
is the second); its weight, bias (when there is one) and the scale are constants of one
float dtype, checked before anything changes. Each fold gets its own new constants,
named and placed as the stock pass does (``<weight>_folded_mul`` before the weight,
``<bias>_folded_mul`` before the bias) and made unique where that name is taken (the
stock pass's ``create_constant_placeholder`` returns an existing node of that name: two
convolutions sharing a weight, each with its own scale, both got the first one's scaled
weight; here the second is ``<weight>_folded_mul_1``). The convolution is edited in
place, as the stock pass edits it: it keeps its name, after which the next Arm pass
(``RewriteConvPass``) names the weight it transposes.
The fold works on the exported program's constants, never on a module's own tensors
(the stock pass, run on a graph module at quantization time, writes the scaled weight
into the module's parameter in place: the user's ``nn.Module`` itself).
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
    any_float,
    any_value,
    capture,
    lit,
    op,
)
from fusionkit.passes._constraint import constraint
from fusionkit.passes.families.conv_batch_norm import CONV

__all__ = ["MUL_SCALAR", "MUL_TENSOR", "ROLE", "channel_scale", "rules", "scale_conv"]

MUL_TENSOR = "aten.mul.Tensor"
MUL_SCALAR = "aten.mul.Scalar"

_CONV_ARGS = ("stride", "padding", "dilation", "output_padding", "groups")

#: why the weight, bias and scale must be constants
ROLE = "the scale is folded into the convolution's weight and bias at lowering time"


def _conv() -> Any:
    return op(CONV, capture("x"), capture("w"), lit(None) | capture("b"), any_value("stride"),
              any_value("padding"), any_value("dilation"), lit(False),
              any_value("output_padding"), any_value("groups")).bind("conv")


def channel_scale(scale: torch.Tensor, out_shape: tuple[int, ...]) -> torch.Tensor | None:
    """``scale`` as a ``[C]`` vector when it broadcasts over an output of ``out_shape``
    along the channel dimension (1) only; else None."""
    if len(out_shape) < 2:
        return None
    c = int(out_shape[1])
    if scale.numel() == 1:
        return scale.reshape(1).expand(c).clone()
    if scale.dim() > len(out_shape) or scale.numel() != c:
        return None
    padded = (1,) * (len(out_shape) - scale.dim()) + tuple(scale.shape)
    if any(int(n) != 1 for d, n in enumerate(padded) if d != 1):
        return None
    return scale.reshape(c)


def _val(v: Any) -> Any:
    return v.meta.get("val") if isinstance(v, Node) else None


def _scale_check(ctx: CheckContext, conv: Node, w: Node, scale: Any, b: Any = None
                 ) -> str | MatchResult | None:
    """The scale is a number, or a constant float tensor of the weight's dtype broadcasting
    over the channels only; the weight and bias are float tensors of one dtype."""
    wt, out = _val(w), _val(conv)
    if not isinstance(wt, torch.Tensor) or not wt.is_floating_point():
        return f"weight `{w.name}` is not a float tensor: scaling it changes the integers"
    if isinstance(b, Node) and getattr(_val(b), "dtype", None) != wt.dtype:
        return f"bias `{b.name}` is not {wt.dtype}, the weight's dtype"
    if not isinstance(out, torch.Tensor):
        return f"convolution `{conv.name}` has no known output shape"
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return None
    if not isinstance(scale, Node):
        return f"the scale {scale!r} is neither a number nor a tensor"
    if ctx.inputs.constant(scale) is None:
        return ctx.fail(f"scale `{scale.name}` is {ctx.inputs.describe(scale)}, not a "
                        f"constant: {ROLE}", at=scale)
    st = _val(scale)
    if not isinstance(st, torch.Tensor) or st.dtype != wt.dtype:
        return ctx.fail(f"scale `{scale.name}` is not a {wt.dtype} tensor like the weight",
                        at=scale)
    if channel_scale(torch.empty(st.shape), tuple(out.shape)) is None:
        return ctx.fail(f"scale `{scale.name}` of shape {list(st.shape)} does not broadcast "
                        f"over the {list(out.shape)} output along the channels only", at=scale)
    return None


def scale_conv(rw: Rewriter, conv: Node, x: Node, w: Node, scale: Any, stride: Any,
               padding: Any, dilation: Any, output_padding: Any, groups: Any,
               b: Node | None = None) -> Node:
    """The replacement: the convolution with its weight and bias scaled per channel."""
    weight = rw.tensor(w)
    s = (torch.tensor(float(scale), dtype=weight.dtype) if not isinstance(scale, Node)
         else rw.tensor(scale))
    per_channel = channel_scale(s, tuple(conv.meta["val"].shape))
    assert per_channel is not None  # (the constraint)
    per_channel = per_channel.to(weight.dtype)
    w_new = rw.fresh_constant(f"{w.name}_folded_mul",
                              weight * per_channel.reshape((-1,) + (1,) * (weight.dim() - 1)))
    rw.move_before(w_new, w)
    b_new = None
    if b is not None:
        b_new = rw.fresh_constant(f"{b.name}_folded_mul", rw.tensor(b) * per_channel)
        rw.move_before(b_new, b)
    args = list(conv.args)
    args[1], args[2] = w_new, b_new
    return rw.edit(conv, tuple(args))  # in place, as the stock pass edits the convolution


def rules(prefix: str = "") -> list[Rule]:
    """conv * scale (a constant tensor or a number), folded into the convolution."""
    constraints = [PrepackableConstant("w", role=ROLE),
                   constraint("bias_is_constant")(_bias_constant),
                   constraint("scale_is_a_constant_channel_scale", hints={"scale": OperandHint(constant=True)})(_scale_check)]
    return [
        Rule(name=f"{prefix}conv_mul_scale",
             pattern=op(MUL_TENSOR, _conv(), capture("scale")),
             constraints=constraints, replacement=PythonReplacement(scale_conv),
             description="a convolution times a constant per-channel scale, folded into "
                         "its weight and bias"),
        Rule(name=f"{prefix}conv_mul_scalar",
             pattern=op(MUL_SCALAR, _conv(), any_float("scale")),
             constraints=constraints, replacement=PythonReplacement(scale_conv),
             description="a convolution times a number, folded into its weight and bias"),
    ]


def _bias_constant(ctx: CheckContext, b: Node | None = None) -> MatchResult | None:
    """A bias, when there is one, is scaled too: it must be a constant."""
    if b is None or ctx.inputs.constant(b) is not None:
        return None
    return ctx.fail(f"bias `{b.name}` is {ctx.inputs.describe(b)}, not a constant: {ROLE}",
                    at=b)
