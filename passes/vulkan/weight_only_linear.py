"""A linear with a per-channel int8 weight and a float input: the weight-only quantized kernels.

Replaces ``FuseQuantizedOpsTransform`` (``executorch/backends/vulkan/_passes/
fuse_quantized_ops.py``, run by ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1; its
only pattern is ``linear_qcnw``)::

    linear(x, dequantize_per_channel(weight, scales, zeros, axis, qmin, qmax, int8), bias?)
    -> aten._weight_int8pack_mm(x, weight, scales) (+ bias)           8-bit values
    -> et_vk.linear_qcs4w(x, pack_4bit(weight), scales) (+ bias)      values in [-8, 7]

(``add(., bias)`` as the stock pass writes it). The stock detection, stated as
constraints: ``x`` is not a dequantize (a dynamically quantized linear is another
kernel), the weight and the zero points are constants, the weight is int8; which kernel
is chosen by the weight's values, as the stock pass chooses. The 4-bit weight is packed
with the stock pass's own ``pack_4bit_weight_tensor``, so the bytes are the same.

What the stock pass forgets, declined here before anything changes:

* zero points that are not all 0 (``per_channel_affine``): the stock pass detects the
  pattern, then raises ``NotImplementedError`` inside preprocess -- the lowering dies;
* a weight quantized along another axis than the output channels (``axis`` 1): both
  kernels take one scale per output channel, so the stock rewrite scales the wrong way;
* scales that are not constants (both kernels prepack them);
* for 8 bits, an input of rank other than 2 or a dtype other than float32 / float16:
  ``_weight_int8pack_mm`` takes a 2-D float matrix, and the stock pass's retrace dies on it;
* a 4-bit weight shared with another user is packed once into a new constant (the stock
  pass overwrites the shared state-dict entry under the other user's feet).

Beyond the stock pass, torchao's 8-bit weight-only linear
(``IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))``), which stock
ExecuTorch 1.5.1 leaves as ``linear(x, torchao.dequantize_affine(w, [1, K], scales,
zeros, int8, qmin, qmax))`` -- an op neither the Vulkan runtime nor the CPU runtime has,
so the program is refused at load -- is the same computation as the per-channel one:
``linear_weight_int8_affine`` makes it ``aten._weight_int8pack_mm(x, w, scales)``
(scales ``[N, 1]`` -> ``[N]``, a new constant). Asymmetric zero points (one per output
channel, constants) are folded: ``x (w - zp)^T s = (x w^T) s - sum_k(x_k) zp s``, so
``_weight_int8pack_mm(x, w, s) - sum(x, [-1], keepdim) * c`` with ``c = zp * s`` a new
``[N]`` constant (float32 inputs only: measured on the runtime). Declined (with the
reason) for a block size other than one row per output channel (group-wise int8 has no
kernel), non-zero zero points with a float16 input, an input that is not 2-D float32 /
float16, scales of another dtype than the input's.

Placement, for the stock payload's bytes: the fused op and the bias ``add`` go where
the linear was; the packed 4-bit weight takes the source weight's place among the
placeholders (the stock pass packs it in place) and the source goes when nothing else
reads it. The zero points stay, unused, as the stock pass leaves them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    MatchResult,
    PrepackableConstant,
    PythonReplacement,
    Rewriter,
    Rule,
    any_value,
    capture,
    lit,
    op,
    op_key,
)
from fusionkit.passes._provenance import keep_provenance
from fusionkit.passes.registry import (
    OperandHint,
    OpSemantics,
    Pick,
    register_rules,
)

from ._common import DQ_PER_CHANNEL, constant_tensor, constraint, et_vk, shape, zero_points_are_zero

STOCK_PASS = "FuseQuantizedOpsTransform"
LINEAR = "aten.linear.default"
DQ_AFFINE = "torchao.dequantize_affine.default"
INT8_MM = "aten._weight_int8pack_mm.default"
#: float dtypes ``_weight_int8pack_mm`` takes that the Vulkan runtime has (no bf16)
INT8_MM_DTYPES = frozenset({torch.float32, torch.float16})


def _pattern() -> Any:
    wdq = op(DQ_PER_CHANNEL, capture("weight"), capture("scales"), capture("zeros"),
             any_value("axis"), any_value("qmin"), any_value("qmax"), any_value("wdtype"))
    return (op(LINEAR, capture("x"), wdq)
            | op(LINEAR, capture("x"), wdq, lit(None) | capture("bias")))


def _affine_pattern() -> Any:
    wdq = op(DQ_AFFINE, capture("weight"), any_value("block_size"), capture("scales"),
             lit(None) | capture("zeros"), lit(torch.int8), any_value("qmin"),
             any_value("qmax"))
    return (op(LINEAR, capture("x"), wdq)
            | op(LINEAR, capture("x"), wdq, lit(None) | capture("bias")))


def _float_input(ctx: CheckContext, x: Node) -> str | MatchResult | None:
    """The stock test: a dequantized input means a dynamically quantized linear."""
    import executorch.backends.vulkan.utils as vk_utils

    if vk_utils.is_dequant_node(x):
        return ctx.fail(f"the input `{x.name}` is dequantized: a dynamically quantized linear, "
                        "not a weight-only one", at="x")
    return None


def _per_output_channel(ctx: CheckContext, weight: Node, scales: Node, axis: Any
                        ) -> str | MatchResult | None:
    w, s = shape(weight), shape(scales)
    if w is None or len(w) != 2:
        return ctx.fail(f"the weight `{weight.name}` has the shape {w}, not [N, K]", at="weight")
    if not (isinstance(axis, int) and axis % 2 == 0):
        return (f"the weight is quantized along axis {axis!r}, not its output channels (axis 0): "
                "the kernels apply one scale per output channel")
    if s != (w[0],):
        return ctx.fail(f"the scales have the shape {s}, not [{w[0]}]", at="scales")
    return None


def _one_block_per_row(ctx: CheckContext, weight: Node, scales: Node, block_size: Any
                       ) -> str | MatchResult | None:
    """torchao's per-channel int8 weight: block ``[1, K]``, one scale per output channel."""
    w, s = shape(weight), shape(scales)
    if w is None or len(w) != 2:
        return ctx.fail(f"the weight `{weight.name}` has the shape {w}, not [N, K]", at="weight")
    if not isinstance(block_size, (list, tuple)) or list(block_size) != [1, w[1]]:
        return (f"the weight is quantized in blocks of {block_size!r}, not one block [1, {w[1]}] "
                "per output channel: the runtime's only 8-bit weight-only kernel "
                "(_weight_int8pack_mm) takes one scale per output channel")
    if s not in ((w[0],), (w[0], 1)):
        return ctx.fail(f"the scales have the shape {s}, not [{w[0]}] or [{w[0]}, 1]", at="scales")
    return None


def _scales_dtype(ctx: CheckContext, x: Node, scales: Node) -> str | MatchResult | None:
    sv, xv = scales.meta.get("val"), x.meta.get("val")
    sd, xd = getattr(sv, "dtype", None), getattr(xv, "dtype", None)
    if sd is None or sd != xd:
        return ctx.fail(f"the scales `{scales.name}` are {sd}, the input `{x.name}` {xd}: "
                        "_weight_int8pack_mm takes scales of the input's dtype", at="scales")
    return None


def _zero_points_foldable(ctx: CheckContext, x: Node, weight: Node, zeros: Node | None = None
                          ) -> str | MatchResult | None:
    """Zero points that are 0, or (asymmetric) one constant per output channel with a
    float32 input: folded into a correction term (:func:`_int8_mm_per_row`)."""
    if zero_points_are_zero(ctx, zeros) is None:
        return None
    assert zeros is not None
    t, w = constant_tensor(ctx, zeros), shape(weight)
    if t is None:
        return ctx.fail(f"zero point `{zeros.name}` is not a constant: it cannot be folded "
                        "into a constant correction", at="zeros")
    if w is None or len(w) != 2 or tuple(t.shape) not in ((w[0],), (w[0], 1)):
        return ctx.fail(f"the zero points `{zeros.name}` have the shape {tuple(t.shape)}, not "
                        "one per output channel", at="zeros")
    xd = getattr(x.meta.get("val"), "dtype", None)
    if xd != torch.float32:
        return ctx.fail(f"zero point `{zeros.name}` is not all zeros and the input is {xd}: "
                        "the folded correction (x.sum(-1) * zeros * scales) is measured exact "
                        "on the runtime for float32 only", at="x")
    return None


def _symmetric(ctx: CheckContext, zeros: Node) -> str | MatchResult | None:
    """Stock detects affine weights, then raises NotImplementedError in preprocess."""
    return zero_points_are_zero(ctx, zeros)


def _int8_weight(ctx: CheckContext, weight: Node) -> str | MatchResult | None:
    t = constant_tensor(ctx, weight)
    if t is None:
        return ctx.fail(f"the weight `{weight.name}` is not a constant", at="weight")
    if t.dtype != torch.int8:
        return ctx.fail(f"the weight `{weight.name}` is {t.dtype}, not int8", at="weight")
    return None


def _is_4bit(ctx: CheckContext, weight: Node) -> bool:
    t = constant_tensor(ctx, weight)
    return t is not None and (t.numel() == 0 or (int(t.min()) >= -8 and int(t.max()) <= 7))


def _values_in_4_bits(ctx: CheckContext, weight: Node) -> str | MatchResult | None:
    if _is_4bit(ctx, weight):
        return None
    return "the weight's values do not fit in 4 bits: the 8-bit kernel takes it"


def _values_beyond_4_bits(ctx: CheckContext, weight: Node) -> str | MatchResult | None:
    if not _is_4bit(ctx, weight):
        return None
    return "the weight's values fit in 4 bits: the 4-bit kernel takes it (as stock chooses)"


def _int8_mm_input(ctx: CheckContext, x: Node) -> str | MatchResult | None:
    v = x.meta.get("val")
    if not isinstance(v, torch.Tensor) or v.dim() != 2:
        return ctx.fail(f"the input `{x.name}` has the shape {shape(x)}: _weight_int8pack_mm "
                        "takes a 2-D matrix", at="x")
    if v.dtype not in INT8_MM_DTYPES:
        return ctx.fail(f"the input `{x.name}` is {v.dtype}: _weight_int8pack_mm takes "
                        "float32 / float16 here", at="x")
    return None


def _bias_node(ctx: CheckContext, bias: Any = None) -> str | MatchResult | None:
    if bias is None or isinstance(bias, Node):
        return None
    return f"the bias is the literal {bias!r}, not a tensor"


def _with_bias(rw: Rewriter, out: Node, bias: Any) -> Node:
    keep_provenance(out, rw.root)  # the stock pass's nodes stand where the linear stood
    if bias is None:
        return out
    added = rw.call("aten.add.Tensor", out, bias)
    keep_provenance(added, rw.root)
    return added


def _int8_mm(rw: Rewriter, x: Node, weight: Node, scales: Node, bias: Any = None) -> Node:
    return _with_bias(rw, rw.call(INT8_MM, x, weight, scales), bias)


def _int8_mm_per_row(rw: Rewriter, x: Node, weight: Node, scales: Node, bias: Any = None,
                     zeros: Node | None = None) -> Node:
    s = rw.tensor(scales)
    scales_in = scales
    if s.dim() != 1:  # torchao's [N, 1]: the kernel's [N] (a new constant, the source stays)
        scales = rw.constant(f"{scales_in.name}_fk_per_channel", s.reshape(-1))
    zp = None if zeros is None else rw.tensor(zeros)
    if zp is None or not bool((zp != 0).any()):
        return _int8_mm(rw, x, weight, scales, bias)
    # x (w - zp)^T s = (x w^T) s - sum_k(x_k) (zp s): the kernel on the int8 weight, less a
    # constant [N] vector zp * s (computed here, in float64) times each row's sum
    zs = rw.constant(f"{zeros.name}_{scales_in.name}_fk_zero_times_scale",  # type: ignore[union-attr]
                     (zp.double().reshape(-1) * s.double().reshape(-1)).to(s.dtype))
    mm = rw.call(INT8_MM, x, weight, scales)
    row_sums = rw.call("aten.sum.dim_IntList", x, [-1], True)
    correction = rw.call("aten.mul.Tensor", row_sums, zs)
    out = rw.call("aten.sub.Tensor", mm, correction)
    for n in (mm, row_sums, correction):
        keep_provenance(n, rw.root)
    return _with_bias(rw, out, bias)


def _take_place_of(rw: Rewriter, new: Node, old: Node, reader: Node) -> None:
    """``new`` stands where ``old`` stood (graph and signature); ``old`` goes when ``reader``
    (the dequantize the match erases) was its only user."""
    rw.move_before(new, old)
    if set(old.users) != {reader}:
        return  # another user still reads the unpacked weight
    rw.reroute(old, new)  # the erased dequantize reads the copy
    rw.erase(old)  # with its signature entry and tensor


def linear_qcs4w_kernel(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor
                        ) -> torch.Tensor:
    """What the runtime's ``linear_qcsnw_tiled`` 4-bit shader computes
    (``QuantizedLinearQCSNW.cpp``) from the bytes ``pack_4bit_weight_tensor`` writes: byte
    ``j`` of row n holds ``w[n, 2j] + 8`` in the high nibble and ``w[n, 2j+1] + 8`` in the low
    one; the shader reads the raw nibbles and subtracts ``8 * sum_k x[m, k]``, so
    ``out[m, n] = sum_k x[m, k] * (nibble[n, k] - 8) * s[n]`` in float. ExecuTorch's CPU
    reference (``custom_ops_lib.linear_qcs4w``) drops the ``- 8``."""
    packed = weight.to(torch.uint8).to(torch.int16)
    n, k = packed.shape[0], x.shape[-1]
    w = torch.empty((n, packed.shape[1] * 2), dtype=torch.int16)
    w[:, 0::2] = (packed >> 4) & 0x0F
    w[:, 1::2] = packed & 0x0F
    w = w[:, :k] - 8  # an odd K was padded with a zero weight
    s = scales.reshape(-1)[:n].to(torch.float32)  # the shader reads the scales flat
    return (x.to(torch.float32) @ (w.to(torch.float32) * s.reshape(n, 1)).t()).to(x.dtype)


#: what the rules' 4-bit kernel computes, for fusionkit.verify (torch has no CPU implementation)
SEMANTICS = OpSemantics(kernel_references={"et_vk.linear_qcs4w.default": linear_qcs4w_kernel})


def _linear_qcs4w(rw: Rewriter, x: Node, weight: Node, scales: Node, bias: Any = None) -> Node:
    from executorch.backends.vulkan._passes.fuse_quantized_ops import pack_4bit_weight_tensor

    packed = rw.constant(f"{weight.name}_fk_qcs4w", pack_4bit_weight_tensor(rw.tensor(weight)))
    wdq = next((u for u in weight.users if u in rw.root.all_input_nodes
                and op_key(u.target) == DQ_PER_CHANNEL), None)
    if wdq is not None:
        _take_place_of(rw, packed, weight, wdq)
    return _with_bias(rw, rw.call(et_vk("linear_qcs4w"), x, packed, scales), bias)


def _constraints() -> list[Any]:
    role = "the weight-only kernels prepack it"
    return [constraint("input_not_dequantized")(_float_input),
            PrepackableConstant("weight", role=role), PrepackableConstant("scales", role=role),
            PrepackableConstant("zeros", role=role),
            constraint("int8_weight")(_int8_weight),
            constraint("symmetric_weight",  # an all-zero constant zero point
                       hints={"zeros": OperandHint(constant=True, fill="zeros")})(_symmetric),
            constraint("per_output_channel",  # [N, K], one scale per output channel
                       hints={"weight": OperandHint(shapes=((2, 4), (3, 4), (1, 4)))})(_per_output_channel),
            constraint("bias_is_a_tensor")(_bias_node)]


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS, semantics=SEMANTICS)
def weight_only_linear_rules() -> list[Rule]:
    """linear with a per-channel int8 weight -> the 8-bit or the 4-bit weight-only kernel;
    torchao's per-channel int8 ``dequantize_affine`` weight -> the 8-bit one."""
    return [
        Rule(name="linear_weight_int4",
             pattern=_pattern(),
             constraints=[*_constraints(), constraint("values_in_4_bits")(_values_in_4_bits)],
             replacement=PythonReplacement(_linear_qcs4w),
             description="weight-only linear, values in [-8, 7] -> et_vk.linear_qcs4w"),
        Rule(name="linear_weight_int8",
             pattern=_pattern(),
             constraints=[*_constraints(), constraint("values_beyond_4_bits",  # values that do not fit in 4 bits
                                                     hints={"weight": OperandHint(fill="int8")})(_values_beyond_4_bits),
                          constraint("int8pack_mm_input",  # a 2-D input, K as the weights' above
                                     hints={"x": OperandHint(shapes=((2, 4), (1, 4), (3, 4)))})(_int8_mm_input)],
             replacement=PythonReplacement(_int8_mm),
             description="weight-only linear, 8-bit values -> aten._weight_int8pack_mm"),
        Rule(name="linear_weight_int8_affine",
             pattern=_affine_pattern(),
             constraints=[constraint("input_not_dequantized")(_float_input),
                          PrepackableConstant("weight", role="_weight_int8pack_mm prepacks it"),
                          PrepackableConstant("scales", role="_weight_int8pack_mm prepacks it"),
                          constraint("int8_weight")(_int8_weight),
                          constraint("one_block_per_output_channel", hints=affine_int8_operands)(_one_block_per_row),
                          constraint("zero_points_foldable")(_zero_points_foldable),
                          constraint("int8pack_mm_input",  # a 2-D input, K as the weights' above
                                     hints={"x": OperandHint(shapes=((2, 4), (1, 4), (3, 4)))})(_int8_mm_input),
                          constraint("scales_dtype_of_input")(_scales_dtype),
                          constraint("bias_is_a_tensor")(_bias_node)],
             replacement=PythonReplacement(_int8_mm_per_row),
             description="torchao 8-bit weight-only linear (dequantize_affine, per channel) "
                         "-> aten._weight_int8pack_mm (- x.sum(-1) * zeros * scales)"),
    ]


def affine_int8_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: torchao's per-channel int8 weight as the checks take it: an
    [N, K] int8 weight, one block [1, K] per output channel, scales and zero points [N] or
    [N, 1] (the zero points drawn nonzero too: the rule folds them), a 2-D float32 input."""
    n, k, m = pick((1, 2, 3)), pick((2, 4)), pick((1, 2, 3))
    per_channel = pick(((n,), (n, 1)))
    return {"x": OperandHint(dtype=torch.float32, shapes=((m, k),)),
            "weight": OperandHint(shapes=((n, k),), dtype=torch.int8, int_range=(-128, 127)),
            "block_size": OperandHint(values=([1, k],)),
            "scales": OperandHint(shapes=(per_channel,), fill="positive", dtype=torch.float32),
            "zeros": OperandHint(constant=True, shapes=(per_channel,), dtype=torch.int32,
                                 int_range=pick(((0, 0), (-3, 3)))),
            "qmin": OperandHint(values=(-128,)), "qmax": OperandHint(values=(127,)),
            "bias": OperandHint(shapes=((n,),), dtype=torch.float32)}



__all__ = ["STOCK_PASS", "weight_only_linear_rules"]
