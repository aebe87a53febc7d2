"""Port of ExecuTorch 1.5.1 ``patterns/quantized_convolution.py`` (registry: ``quantized_convolution``).

A statically quantized 2-D convolution, as pt2e leaves it::

    y = convolution(dq(x_int8), dq_per_channel(w_int8, scales, zps), bias, ...)
    out = quantize_per_tensor(y | relu(y), out_scale, out_zp, -128, 127, int8)

-> ``et_vk.q8ta_conv2d`` (im2col), ``_pw`` (1x1, stride 1, no padding or
dilation), ``_dw`` (depthwise) or ``_transposed``, with the weight re-laid
out as the kernels read it: ``[OC, H*W*IC/g]`` (im2col, transposed) or
``[H, W, OC]`` (depthwise), width padded to 4; per-channel weight sums (int32,
padded to 4); scales and bias padded to 4. The new layouts are new constants
named after their source weight (the shared state-dict entry is never
overwritten, unlike the stock ``register_param_mutation`` path).

Constraints stated: the input is int8 per-tensor dequantized (literal scale
and zero point) and the output re-quantized int8; weight, weight scales and
(if any) bias are prepackable constants; the weight is int8 rank 4, symmetric
(all-zero zero points: the kernels take no weight zero point, the stock code
never looked), quantized per output channel (axis 0, or axis 1 for a
transposed weight ``[IC, OC/g, H, W]``) with scales ``[OC]``; a bias is a
float vector ``[OC]`` (the stock detector traced through whatever produced it
and passed the placeholder found, e.g. an int32 quantized bias); grouped
(non-depthwise) convs have a multiple of 4 output channels per group;
depthwise convs have a multiple of 4 output channels (the stock replacement
asserted this after deciding to fuse); transposed convs have dilation 1 and
no groups (the per-channel scales of a grouped transposed weight cover
OC/g channels only); grouped convs have a multiple of 4 input channels per group
and the input has batch 1 (the runtime aborts otherwise); stride, padding and
dilation are pairs of ints.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    DtypeIn,
    MatchResult,
    Pattern,
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
from fusionkit.passes.registry import (
    OperandHint,
    OpSemantics,
    Pick,
    register_rules,
)

from ._common import (
    DQ_PER_CHANNEL,
    constraint,
    et_vk,
    int8_dq,
    int8_q,
    shape,
    zero_points_are_zero,
)
from .quantized_linear import pad_to, padded


def _conv() -> Pattern:
    x = int8_dq(capture("x"), "in")
    w = op(DQ_PER_CHANNEL, capture("weight"), capture("w_scales"), capture("w_zp"),
           any_value("axis"), any_value("w_qmin"), 127, lit(torch.int8))
    conv = op("aten.convolution.default", x, w, capture("bias"), any_value("stride"),
              any_value("padding"), any_value("dilation"), any_value("transposed"),
              any_value("output_padding"), any_value("groups"))
    conv2d = op("aten.conv2d.default", x, w, capture("bias"), any_value("stride"),
                any_value("padding"), any_value("dilation"), any_value("groups"))
    return conv | conv2d


def _pair(v: Any) -> list[int] | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v, v]
    if isinstance(v, (list, tuple)) and len(v) in (1, 2) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in v):
        return [v[0], v[-1]]
    return None


def _geometry(w: tuple[int, ...], groups: int, stride: Any, padding: Any, dilation: Any,
              transposed: Any = False, output_padding: Any = (0, 0)) -> dict[str, Any]:
    """OC, IC per group, kernel size and the op variant of a match (weight shape ``w``)."""
    transposed = bool(transposed)
    if transposed:
        ic, ocg, kh, kw = w
        oc, icg = ocg * groups, ic // groups
    else:
        oc, icg, kh, kw = w
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    depthwise = not transposed and icg == 1 and groups == oc
    pointwise = (kh == 1 and kw == 1 and stride == [1, 1] and dilation == [1, 1]
                 and padding == [0, 0])
    kind = ("transposed" if transposed else "dw" if depthwise else "pw" if pointwise else "im2col")
    return {"oc": oc, "icg": icg, "kh": kh, "kw": kw, "kind": kind, "transposed": transposed,
            "stride": stride, "padding": padding, "dilation": dilation,
            "output_padding": _pair(output_padding)}


#: why the quantized convolution's weight, scales and bias must be constants (in declines)
CONV_ROLE = "the quantized convolution prepacks it"


def _conv_geometry(ctx: CheckContext, weight: Node, w_scales: Node, axis: Any, w_qmin: Any,
                   stride: Any, padding: Any, dilation: Any, groups: Any,
                   # bound by aten.convolution only (aten.conv2d has neither)
                   transposed: Any = False, output_padding: Any = (0, 0)
                   ) -> str | MatchResult | None:
    w = shape(weight)
    if w is None or len(w) != 4:
        return f"weight {w} is not a 2-D convolution weight"
    if transposed not in (True, False):
        return f"transposed flag {transposed!r} is not a bool"
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        return f"groups {groups!r} is not a positive int"
    if None in (_pair(stride), _pair(padding), _pair(dilation), _pair(output_padding)):
        return (f"stride {stride!r}, padding {padding!r} or dilation "
                f"{dilation!r} is not a pair of ints")
    g = _geometry(w, groups, stride, padding, dilation, transposed, output_padding)
    oc = g["oc"]
    if g["transposed"]:
        if g["dilation"] != [1, 1]:
            return f"transposed conv with dilation {g['dilation']}: the kernel supports 1 only"
        if groups != 1:
            return ("grouped transposed conv: its per-channel scales cover OC/groups "
                    "channels, not the OC the kernel indexes")
    if axis != (1 if g["transposed"] else 0):
        return (f"weight quantized along axis {axis}, not the output-channel axis "
                f"{1 if g['transposed'] else 0}")
    if w_qmin not in (-127, -128):
        return f"weight quant_min {w_qmin} is not that of int8"
    if shape(w_scales) != (oc,):
        return ctx.fail(f"weight scales of shape {shape(w_scales)} are not per output channel "
                        f"[{oc}]", at=w_scales)
    if 1 < groups < oc and (oc // groups) % 4:
        return (f"{oc // groups} output channels per group is not a multiple of 4 "
                "(a group may not cross a texel)")
    if g["kind"] != "dw" and groups > 1 and g["icg"] % 4:
        return (f"{g['icg']} input channels per group is not a multiple of 4: the runtime "
                "aborts (Q8taConv2d.cpp: in_channels_per_group % 4 == 0)")
    if g["kind"] == "dw" and oc % 4:
        return f"depthwise conv with {oc} output channels: the kernel needs a multiple of 4"
    return None


def _conv_batch_1(ctx: CheckContext, x: Node) -> str | None:
    xs = shape(x)
    if xs is not None and xs[0] == 1:
        return None
    return (f"input of shape {xs}: the q8ta conv kernels take batch 1 only (the runtime's "
            "packed int8 layouts have no batch dimension)")


def _conv_zp(ctx: CheckContext, w_zp: Any) -> str | None:
    return zero_points_are_zero(ctx, w_zp)


def _conv_bias(ctx: CheckContext, bias: Any, weight: Node, groups: Any, stride: Any,
               padding: Any, dilation: Any, transposed: Any = False) -> str | None:
    if bias is None:
        return None
    if not isinstance(bias, Node) or ctx.inputs.constant(bias) is None:
        return f"bias {getattr(bias, 'name', bias)!r} is not a constant tensor: {CONV_ROLE}"
    bv, w = bias.meta.get("val"), shape(weight)
    oc = (_geometry(w, groups, stride, padding, dilation, transposed)["oc"]
          if w is not None and len(w) == 4 else None)
    if not isinstance(bv, torch.Tensor) or bv.dtype != torch.float32 or tuple(bv.shape) != (oc,):
        got = (getattr(bv, "dtype", None), tuple(getattr(bv, "shape", ())))
        return f"bias {got} is not a float32 vector [{oc}]"
    return None


def _conv_build(rw: Rewriter, x: Node, in_scale: float, in_zp: int, weight: Node,
                w_scales: Node, out_scale: float, out_zp: int, bias: Node | None,
                stride: Any, padding: Any, dilation: Any, groups: int,
                transposed: Any = False, output_padding: Any = (0, 0),
                relu: Node | None = None) -> Node:
    w = rw.tensor(weight)
    g = _geometry(tuple(w.shape), groups, stride, padding, dilation, transposed, output_padding)
    oc, icg, kh, kw, kind = g["oc"], g["icg"], g["kh"], g["kw"], g["kind"]
    if kind == "transposed":
        ic, ocg = w.shape[0], w.shape[1]
        mat = (w.reshape(groups, ic // groups, ocg, kh, kw).permute(0, 2, 3, 4, 1)
               .reshape(oc, kh * kw * icg).contiguous())
        sums = mat.sum(dim=1)
    elif kind == "dw":
        mat = w.permute(2, 3, 1, 0).contiguous().view(kh, kw, oc).contiguous()
        sums = mat.sum(dim=(0, 1))
    else:
        mat = w.permute(0, 2, 3, 1).contiguous().view(oc, kh * kw * icg).contiguous()
        sums = mat.sum(dim=1)
    packed = rw.constant(f"{weight.name}_fk_q8ta_conv_{kind}_pad4", pad_to(mat, 4))
    sums_n = rw.constant(f"{weight.name}_fk_q8ta_conv_{kind}_sums_pad4",
                         pad_to(sums.to(torch.int32), 4))
    target = {"transposed": "q8ta_conv2d_transposed", "dw": "q8ta_conv2d_dw",
              "pw": "q8ta_conv2d_pw", "im2col": "q8ta_conv2d"}[kind]
    args: list[Any] = [x, in_scale, in_zp, packed, sums_n, padded(rw, w_scales), out_scale,
                       out_zp, padded(rw, bias), [kh, kw], g["stride"], g["padding"]]
    if kind == "transposed":
        args.append(g["output_padding"])
    args += [g["dilation"], groups, "relu" if relu is not None else "none"]
    return rw.call(et_vk(target), *args)


#: its CPU reference reads another weight layout than the one it is given: fusionkit.verify
#: never judges a rule through it (the pointwise, depthwise and transposed ops it does judge)
SEMANTICS = OpSemantics(reference_caveats={
    "et_vk.q8ta_conv2d.default":
    "its CPU reference (executorch.backends.vulkan.custom_ops_lib.q8ta_conv2d) views the packed "
    "[OC, KH*KW*IC] weight as [OC, IC, KH, KW]; the stock packer "
    "(patterns/quantized_convolution.py) and this rule write it in (KH, KW, IC) order"})


@register_rules("vulkan_patterns", "vulkan", takes_over="quantized_convolution",
                roots=("quantized_decomposed.quantize_per_tensor.default",), semantics=SEMANTICS)
def quantized_convolution_rule(name: str = "quantized_convolution") -> Rule:
    role = CONV_ROLE
    act = _conv() | op("aten.relu.default", _conv()).bind("relu")

    geometry = constraint("conv_geometry", hints=conv_operands)(_conv_geometry)
    zp = constraint("weight_zero_points_zero",  # symmetric: an all-zero constant zero point
                    hints={"w_zp": OperandHint(constant=True, fill="zeros")})(_conv_zp)
    bias = constraint("bias_is_constant_vector")(_conv_bias)
    build = _conv_build

    return Rule(
        name=name,
        pattern=int8_q(act, "out"),
        constraints=[DtypeIn("x", frozenset({torch.int8})), Rank("x", frozenset({4})),
                     PrepackableConstant("weight", role=role),
                     PrepackableConstant("w_scales", role=role),
                     DtypeIn("weight", frozenset({torch.int8})), Rank("weight", frozenset({4})),
                     constraint("batch_1")(_conv_batch_1), geometry, zp, bias],
        replacement=PythonReplacement(build),
        description="int8 static conv2d (+relu) with int8 output into et_vk.q8ta_conv2d(_pw/_dw/"
                    "_transposed)",
    )


def conv_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: an int8 conv the geometry check accepts, drawn kind first
    (a plain, a depthwise or a transposed conv) and the channels after it: OC a multiple of
    4 (the rule pads scales and bias to 4 as the kernels read them; the ops' CPU references
    take the padded length for OC), per output channel scales along the weight's
    output-channel axis, a batch-1 input whose channels the weight reads."""
    kind, oc, k = pick(("plain", "depthwise", "transposed")), pick((4, 8)), pick((1, 2, 3))
    ic, groups, axis, transposed = pick((1, 2, 4)), 1, 0, False
    if kind == "depthwise":
        ic, groups, w = oc, oc, (oc, 1, k, k)
    elif kind == "transposed":
        w, axis, transposed = (ic, oc, k, k), 1, True
    else:
        w = (oc, ic, k, k)
    side = pick((3, 4))
    return {"x": OperandHint(dtype=torch.int8, shapes=((1, ic, side, side),)),
            "weight": OperandHint(shapes=(w,), int_range=(-127, 127)),
            "w_scales": OperandHint(shapes=((oc,),), fill="positive", dtype=torch.float32),
            "w_zp": OperandHint(shapes=((oc,),), dtype=torch.int64),
            "bias": OperandHint(constant=True, shapes=((oc,),), dtype=torch.float32),
            "axis": OperandHint(values=(axis,)), "w_qmin": OperandHint(values=(-127, -128)),
            "stride": OperandHint(values=([1, 1], [2, 2])),
            "padding": OperandHint(values=([0, 0], [1, 1])),
            "dilation": OperandHint(values=([1, 1],) if transposed else ([1, 1], [2, 2])),
            "transposed": OperandHint(values=(transposed,)),
            "output_padding": OperandHint(values=([0, 0],)),
            "groups": OperandHint(values=(groups,))}




__all__ = ["quantized_convolution_rule"]
