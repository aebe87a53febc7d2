"""Port of ExecuTorch 1.5.1 ``patterns/quantized_linear.py`` (registry: ``quantized_linear``).

The stock detector anchors on ``linear``/``mm``/``addmm``/``bmm``, walks
``args[0]`` chains to find a dequantized constant weight, then the stock
replacement *routes* on what it found — and silently does nothing (yet counts
a fusion) when no route fits. Here each route is its own rule whose
constraints say when it applies:

* ``quantized_linear_q8ta`` — int8 per-tensor input, int8 per-channel weight,
  re-quantized output (optionally relu, optionally behind the views of a 3-D
  linear) -> ``et_vk.q8ta_linear`` or, for one row, ``et_vk.q8ta_linear_gemv``;
* ``quantized_linear_q8csw`` — the same with a float output ->
  ``et_vk.linear_q8ta_q8csw``;
* ``quantized_linear_q4gsw`` — float input, torchao 4-bit per-group weight ->
  ``et_vk.linear_q4gsw``;
* ``quantized_linear_dq8ca_q4gsw`` — the input dynamically quantized per token
  (``torchao.choose_qparams_affine`` -> ``quantize_affine`` -> ``dequantize_affine``)
  and a torchao 4-bit per-group weight -> ``et_vk.linear_dq8ca_q4gsw`` (input,
  its chosen scales and zero points, packed weight, per-group weight sums,
  transposed scales, group size, bias).

Every route also anchors on ``bmm(x, W^T[None])`` (``unsqueeze``/``view``/
``expand`` of the transposed weight), which is ``linear(x, W)`` for batch 1 only.

Constraints stated: weight, weight scales, weight zero points and bias are
prepackable constants; the weight zero points are all 0 (the kernels are
symmetric; the stock code never looked); 8-bit weights quantized along axis 0
with values in [-127, 127], 4-bit weights with values in [-8, 7] and per-row
groups ``[1, G]`` tiling K; scales of shape [N] (per channel) or [N, K/G]
(per group); K a multiple of 4 (texel loads); for the 4-bit routes K a multiple
of 8, G a multiple of 4, a 2-D or 3-D input and (``linear_q4gsw``) N a multiple
of 4, as the runtime's kernels need; the fused op's output shape is
the replaced node's; a bmm anchor has batch 1 and the operand ``[1, K, N]``;
the dynamic route's scale and zero point are outputs 0 and 1 of one int8
[-128, 127] ``choose_qparams_affine`` of the same input with a per-token
block ``[1, .., 1, K]`` (one scale per row). New constants (weight sums,
padded scales/bias, packed 4-bit weight, transposed scales) are new
placeholders named after their source; the shared state-dict entry is never
overwritten. Where both 4-bit routes match one root, the dynamic one wins
(priority), as in the stock router.

Not ported: the ``quantized_decomposed`` per-token dynamic route
(``choose_qparams_per_token_asymmetric``), whose [M, 1] scales the stock
router only accepted for M == 1; such graphs stay unfused (still correct).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from fusionkit import (
    CheckContext,
    Constraint,
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
    op_key,
    per_row_block,
)
from fusionkit.edit.builder import Computed
from fusionkit.passes.registry import (
    OperandHint,
    Pick,
    register_rules,
)

from ._common import (
    DQ_PER_CHANNEL,
    DQ_PER_TENSOR,
    FP_T,
    Q_PER_TENSOR,
    constraint,
    et_vk,
    in_int_range,
    int8_dq,
    int8_q,
    shape,
    zero_points_are_zero,
)
from .quantized_embedding import pack_linear_q4

VIEW = "aten.view_copy.default"
CHOOSE_QPARAMS = "torchao.choose_qparams_affine.default"


def _linear(inp: Pattern, wdq: Pattern) -> Pattern:
    w_t = op("aten.permute_copy.default", wdq, [1, 0])
    # bmm(x[1, M, K], W^T as [1, K, N]) is linear(x, W) (the stock anchor set has bmm)
    w_u = op("aten.unsqueeze_copy.default", w_t, 0)
    w_b = (w_u | op(VIEW, w_t, any_value())
           | op("aten.expand_copy.default", w_u, any_value())).bind("bmm_weight")
    return (op("aten.mm.default", inp, w_t)
            | op("aten.addmm.default", capture("bias"), inp, w_t)
            | op("aten.linear.default", inp, wdq)
            | op("aten.linear.default", inp, wdq, capture("bias"))
            | op("aten.bmm.default", inp, w_b).bind("bmm"))


def _bmm_ok(ctx: CheckContext, weight: Node, bmm: Node | None = None,
            bmm_weight: Node | None = None) -> str | MatchResult | None:
    """A bmm anchor: batch 1 (as the stock detector requires) and the weight operand W^T[None]."""
    if bmm is None:
        return None
    out, w = shape(bmm), shape(weight)
    if out is None or out[0] != 1:
        return ctx.fail(f"bmm with batch {out and out[0]}: only batch 1 is a linear", at=bmm)
    got = shape(bmm_weight)
    if w is None or got != (1, w[1], w[0]):
        return ctx.fail(f"the bmm weight operand {got} is not the transposed weight [1, K, N]",
                        at="bmm_weight")
    return None


def _w8() -> Pattern:
    return op(DQ_PER_CHANNEL, capture("weight"), capture("w_scales"), capture("w_zp"),
              any_value("axis"), any_value("w_qmin"), 127, lit(torch.int8))


def _w4() -> Pattern:
    return op("torchao.dequantize_affine.default", capture("weight"),
              per_row_block("block_size"), capture("w_scales"), capture("w_zp"), lit(torch.int8), -8, 7)


def _linear_zp(ctx: CheckContext, w_zp: Any) -> str | None:
    return zero_points_are_zero(ctx, w_zp)


def _linear_int4_values(ctx: CheckContext, weight: Node) -> str | None:
    return in_int_range(ctx, weight, -8, 7, "weight")


def _linear_int8_values(ctx: CheckContext, weight: Node) -> str | None:
    return in_int_range(ctx, weight, -127, 127, "weight")


def _linear_bias(ctx: CheckContext, weight: Node, bias: Any = None) -> str | MatchResult | None:
    if bias is None:
        return None
    if not isinstance(bias, Node) or ctx.inputs.constant(bias) is None:
        return ctx.fail(f"bias {bias!r} is not a constant tensor: {LINEAR_ROLE}", at="bias")
    w = shape(weight)
    if shape(bias) != (w[0] if w else None,):
        return ctx.fail(f"bias of shape {shape(bias)} is not [N] for weight {w}", at="bias")
    return None


def _linear_k4(ctx: CheckContext, x: Node) -> str | None:
    s = shape(x)
    if s and isinstance(s[-1], int) and s[-1] % 4 == 0:
        return None
    return f"in_channels of input {s} is not a multiple of 4 (texel-aligned loads)"


def _out_shape(ctx: CheckContext, x: tuple[Any, ...] | None, weight: Node) -> str | None:
    w, root = shape(weight), ctx.root.meta.get("val")
    want = (*x[:-1], w[0]) if x and w else None
    got = tuple(root.shape) if isinstance(root, torch.Tensor) else None
    return None if want == got else f"the fused op would produce {want}, the graph has {got}"


def _linear_out_shape(ctx: CheckContext, x: Node, weight: Node) -> str | None:
    return _out_shape(ctx, shape(x), weight)


def _viewed_linear_out_shape(ctx: CheckContext, x: Node, weight: Node,
                             in_view: Node | None = None) -> str | None:
    # a dynamically quantized input viewed to 2-D is fed to the fused op in its viewed shape
    return _out_shape(ctx, shape(in_view) if in_view is not None else shape(x), weight)


#: why the quantized linear's weight, scales and bias must be constants (in declines)
LINEAR_ROLE = "the quantized linear prepacks it"


def _common_constraints(bits: int, viewed_input: bool = False) -> list[Constraint]:
    """``viewed_input``: the route's pattern binds ``in_view`` (a 2-D view of the input)."""
    role = LINEAR_ROLE

    zp = constraint("weight_zero_points_zero",  # symmetric: an all-zero constant zero point
                    hints={"w_zp": OperandHint(constant=True, fill="zeros")})(_linear_zp)
    values = constraint("weight_values")(
        _linear_int4_values if bits == 4 else _linear_int8_values)

    bias = constraint("bias_is_constant_vector")(_linear_bias)
    k4 = constraint("in_channels_multiple_of_4",  # the input channels load in texels of 4
                    hints={"x": OperandHint(shapes=((2, 4), (1, 8), (3, 4)))})(_linear_k4)
    out_shape = constraint("output_shape")(
        _viewed_linear_out_shape if viewed_input else _linear_out_shape)

    return [
        PrepackableConstant("weight", role=role), PrepackableConstant("w_scales", role=role),
        DtypeIn("weight", frozenset({torch.int8})), Rank("weight", frozenset({2})),
        zp, values, bias, constraint("bmm_is_batch_1_linear")(_bmm_ok), k4, out_shape,
    ]


def _per_channel(ctx: CheckContext, weight: Node, w_scales: Node, axis: Any, w_qmin: Any
                 ) -> str | MatchResult | None:
    if axis != 0:
        return f"weight quantized along axis {axis}, not 0 (output channels)"
    if w_qmin not in (-127, -128):
        return f"weight quant_min {w_qmin} is not that of int8"
    w, s = shape(weight), shape(w_scales)
    if w is None or s != (w[0],):
        return ctx.fail(f"weight scales of shape {s} are not per output channel "
                        f"[{w and w[0]}]", at=w_scales)
    return None


def pad_to(t: torch.Tensor, m: int) -> torch.Tensor:
    n = t.shape[-1]
    return t if n % m == 0 else F.pad(t, (0, m - n % m)).contiguous()


def padded(rw: Rewriter, node: Node | None, m: int = 4) -> Node | None:
    if node is None:
        return None
    t = rw.tensor(node)
    if t.shape[-1] % m == 0:
        return node
    return rw.constant(f"{node.name}_fk_pad{m}", pad_to(t, m))


def _weight_sums(rw: Rewriter, w: Node) -> Node:
    sums = rw.tensor(w).sum(dim=1).to(torch.int32)
    return rw.constant(f"{w.name}_fk_sums_pad4", pad_to(sums, 4))


def _q8ta_build(rw: Rewriter, x: Node, in_scale: float, in_zp: int, weight: Node,
                w_scales: Node, out_scale: float, out_zp: int, bias: Node | None = None,
                relu: Node | None = None) -> Node:
    rows = x.meta["val"].shape
    gemv = len(rows) >= 2 and rows[-2] == 1
    return rw.call(et_vk("q8ta_linear_gemv" if gemv else "q8ta_linear"), x, in_scale, in_zp,
                   weight, _weight_sums(rw, weight), padded(rw, w_scales), out_scale, out_zp,
                   padded(rw, bias), "relu" if relu is not None else "none")


def q8ta_linear_rule(name: str = "quantized_linear_q8ta") -> Rule:
    dq_in = int8_dq(capture("x"), "in")
    core = _linear(dq_in | op(VIEW, dq_in, any_value()), _w8())
    viewed = core | op(VIEW, core, any_value())
    act = viewed | op("aten.relu.default", viewed).bind("relu")

    build = _q8ta_build

    return Rule(
        name=name,
        pattern=int8_q(act, "out"),
        constraints=[DtypeIn("x", frozenset({torch.int8})),
                     constraint("per_channel_weight", hints=per_channel_operands)(_per_channel), *_common_constraints(8)],
        replacement=PythonReplacement(build),
        description="int8 static linear with int8 output into et_vk.q8ta_linear(_gemv)",
    )


_REQUANT = frozenset({Q_PER_TENSOR, "quantized_decomposed.quantize_per_tensor.tensor"})


def _requantized(n: Node) -> bool:
    for _ in range(3):
        if len(n.users) != 1:
            return False
        n = next(iter(n.users))
        key = op_key(n.target) if n.op == "call_function" else None
        if key in _REQUANT:
            return True
        if key not in (VIEW, "aten.relu.default"):
            return False
    return False


def _q8csw_not_requantized(ctx: CheckContext) -> str | MatchResult | None:
    if _requantized(ctx.root):  # about the root's output: it reads no capture
        return ctx.fail("the output is re-quantized: that is the q8ta_linear route "
                        "(quantized_linear_q8ta), not linear_q8ta_q8csw", at=ctx.root)
    return None


def _float_activation(x: Node, in_scale: float, in_zp: int) -> Node:
    """The float tensor ``x`` quantizes with the dequantize's own parameters
    (``quantize_per_tensor(f, in_scale, in_zp, -128, 127, int8)``), else ``x``.

    The runtime's ``linear_q8ta_q8csw`` quantizes a float activation itself
    (``QuantizedLinear.cpp``: ``fp_input``); stock 1.5.1 passes the int8 tensor, which
    the runtime aborts on at load (pytorch/executorch#22775). An int8 ``x`` that is not
    such a quantize (a graph input) stays: the Vulkan delegate's operand dtypes
    (``passes/vulkan_delegate.py``) make the core decline that match.
    """
    if (x.op == "call_function" and op_key(x.target) == Q_PER_TENSOR
            and list(x.args[1:]) == [in_scale, in_zp, -128, 127, torch.int8]
            and isinstance(x.args[0], Node)):
        return x.args[0]
    return x


def _q8csw_build(rw: Rewriter, x: Node, in_scale: float, in_zp: int, weight: Node,
                 w_scales: Node, bias: Node | None = None) -> Node:
    x = _float_activation(x, in_scale, in_zp)
    node = rw.call(et_vk("linear_q8ta_q8csw"), x, in_scale, in_zp, weight,
                   _weight_sums(rw, weight), padded(rw, w_scales), padded(rw, bias))
    # ExecuTorch 1.5.1's CPU reference of this op ignores the input quantization
    # (linear of the raw int8 tensor), so its fake result is int8; the Vulkan
    # kernel returns the float output of the node it replaces (as the stock pass
    # records it).
    node.meta["val"] = rw.root.meta["val"]
    return node


def q8csw_linear_rule(name: str = "quantized_linear_q8csw") -> Rule:
    root = _linear(int8_dq(capture("x"), "in"), _w8())

    not_requantized = constraint("float_output", hints=float_activation_operands)(_q8csw_not_requantized)
    build = _q8csw_build

    return Rule(
        name=name,
        pattern=root,
        constraints=[not_requantized, DtypeIn("x", frozenset({torch.int8})),
                     constraint("per_channel_weight", hints=per_channel_operands)(_per_channel), *_common_constraints(8)],
        replacement=PythonReplacement(build),
        description="int8 static linear with float output into et_vk.linear_q8ta_q8csw",
    )


def _per_group(ctx: CheckContext, weight: Node, w_scales: Node, block_size: Any
               ) -> str | MatchResult | None:
    w, s, g = shape(weight), shape(w_scales), block_size[1]
    if w is None or w[1] % g:
        return f"weight {w} with group size {g} needs scales [N, K/G], got {s}"
    if s != (w[0], w[1] // g):
        return ctx.fail(f"weight {w} with group size {g} needs scales [N, K/G], got {s}",
                        at=w_scales)
    return None


def _q4_geometry(weight_only: bool) -> Constraint:
    """What the 4-bit kernels of the Vulkan runtime need of K, N, G and the input rank.

    From the runtime (ExecuTorch ``backends/vulkan/runtime/graph/ops``), as the
    simulator's runtime conditions list them: the weight is packed and read as
    ``ceil(K/8)`` uint32 words per row (K % 8 == 4 shifts every later row);
    groups are walked as ``G / 4`` texels with ``K / G`` groups (a group size that
    is not a multiple of 4 mixes scales); the output is resized to [M, N] or
    [B, M, N] only (a 4-D input aborts); ``linear_q4gsw`` prepacks the weight in
    blocks of 4 output channels (``prepack_q4_w_4x8_nc_buffer`` aborts otherwise).
    """
    # module-level checks (not a closure): a spec refers to them by their importable name
    check = _q4gsw_geometry if weight_only else _dq8ca_q4gsw_geometry
    return constraint("q4_kernel_geometry")(check)


def _q4_kernel_geometry(w: tuple[Any, ...] | None, x: tuple[Any, ...] | None, g: Any,
                        weight_only: bool) -> str | None:
    op_name = "linear_q4gsw" if weight_only else "linear_dq8ca_q4gsw"
    if w is None or x is None:
        return "the weight or the input has no static shape"
    n, k = w
    if k % 8:
        return (f"in_channels K = {k} is not a multiple of 8: {op_name} reads each packed "
                "weight row as K/8 32-bit words, so later rows would be read shifted")
    if g % 4:
        return (f"group size {g} is not a multiple of 4: {op_name} walks groups in "
                "texels of 4, mixing the scales of neighbouring groups")
    if len(x) not in (2, 3):
        return (f"input of rank {len(x)}: the {op_name} kernel resizes its output to "
                "[M, N] or [B, M, N] only (the runtime aborts)")
    if weight_only and n % 4:
        return (f"out_channels N = {n} is not a multiple of 4: {op_name} prepacks the "
                "weight in blocks of 4 output channels (the runtime aborts)")
    return None


def _q4gsw_geometry(ctx: CheckContext, weight: Node, x: Node, block_size: Any) -> str | None:
    return _q4_kernel_geometry(shape(weight), shape(x), block_size[1], weight_only=True)


def _dq8ca_q4gsw_geometry(ctx: CheckContext, weight: Node, x: Node, block_size: Any,
                          in_view: Node | None = None) -> str | None:
    rows = shape(in_view) if in_view is not None else shape(x)  # the input as the op sees it
    return _q4_kernel_geometry(shape(weight), rows, block_size[1], weight_only=False)


def _q4_constants(rw: Rewriter, w: Node, s: Node) -> tuple[Node, Node]:
    """The packed 4-bit weight and the transposed [K/G, N] scales (padded to 4), as new constants."""
    n, k = rw.tensor(w).shape
    packed = rw.constant(f"{w.name}_fk_q4_linear", Computed(  # K padded to 8, two per byte
        (n, (k + (-k) % 8) // 2), torch.uint8, lambda: pack_linear_q4(rw.tensor(w))))
    scales_t = rw.constant(f"{s.name}_fk_q4gsw_t_pad4",
                           pad_to(rw.tensor(s).transpose(0, 1).contiguous(), 4))
    return packed, scales_t


def per_group_sums(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Sums of each quantization group, [K/G, N] int32, N padded to a multiple of 4.

    The activation zero point's correction of linear_dq8ca_q4gsw under integer
    accumulation. The runtime reads group ``g``'s sums at ``g * N4 * 4``
    (``linear_int_weight_sums_load.glslh``: rows of N rounded up to 4).
    ExecuTorch's ``compute_per_group_sums`` pads rows to a multiple of 8, so for
    N % 8 == 4 and more than one group its later groups are read shifted; these
    rows are padded to 4, as the runtime reads them.
    """
    n, k = weight.shape
    sums = torch.empty(n, k // group_size, dtype=torch.int32)
    for r in range(0, n, _SUM_ROWS):  # an int32 copy of a block of rows at a time, not of
        # the whole weight (4x its int8 bytes: an LLM's output projection is 1 GB, the
        # export's peak memory)
        block = weight[r:r + _SUM_ROWS].to(torch.int32)
        sums[r:r + _SUM_ROWS] = block.view(-1, k // group_size, group_size).sum(dim=2)
    return pad_to(sums.transpose(0, 1).contiguous(), 4).to(torch.int32).contiguous()


_SUM_ROWS = 4096


def _choose_qparams_item(v: Any, index: int) -> Node | None:
    """The ``torchao.choose_qparams_affine`` node whose output ``index`` is ``v``, else None."""
    if (isinstance(v, Node) and v.op == "call_function" and v.target is operator.getitem
            and len(v.args) == 2 and v.args[1] == index and isinstance(v.args[0], Node)
            and op_key(v.args[0].target) == CHOOSE_QPARAMS):
        return v.args[0]
    return None


def _dynamic_per_token(ctx: CheckContext, x: Node, in_scale: Any, in_zp: Any, in_block: Any
                       ) -> str | MatchResult | None:
    xs, block = shape(x), in_block
    if xs is None or list(block) != [1] * (len(xs) - 1) + [xs[-1]]:
        return f"input block size {block} is not per token (one group per row of {xs})"
    cq_s = _choose_qparams_item(in_scale, 0)
    cq_z = _choose_qparams_item(in_zp, 1)
    if cq_s is None or cq_s is not cq_z:
        return ("the input scale and zero point are not the outputs of one "
                "torchao.choose_qparams_affine: not a dynamically quantized activation")
    a: list[Any] = [*cq_s.args, *([None] * 6)]
    if a[0] is not x or not isinstance(a[2], (list, tuple)) \
            or list(a[2]) != list(block) or a[3] != torch.int8 \
            or (a[4], a[5]) != (-128, 127):
        return (f"`{cq_s.name}` does not choose int8 [-128, 127] per-token parameters of the "
                "quantized input")
    if shape(in_scale) != xs[:-1]:
        return ctx.fail(f"input scales {shape(in_scale)} are not one per row of {xs}",
                        at="in_scale")
    return None


def _dq8ca_build(rw: Rewriter, x: Node, in_scale: Node, in_zp: Node, weight: Node,
                 w_scales: Node, block_size: Any, bias: Node | None = None,
                 in_view: Node | None = None) -> Node:
    packed, scales_t = _q4_constants(rw, weight, w_scales)
    g = int(block_size[1])
    n, k = rw.tensor(weight).shape
    sums = rw.constant(f"{weight.name}_fk_group_sums_g{g}", Computed(
        (k // g, n + (-n) % 4), torch.int32, lambda: per_group_sums(rw.tensor(weight), g)))
    if in_view is not None:  # [B, M, K] quantized per row, then viewed to [B*M, K]: view x alike
        # with the view's own size operand: with a dynamic M its sizes are graph values
        # (sym_size nodes); the meta shape's SymInts cannot be serialized ("Cannot add
        # value for list [s11, 64]", export_llm 8da4w on Vulkan)
        x = rw.call(VIEW, x, in_view.args[1])
    return rw.call(et_vk("linear_dq8ca_q4gsw"), x, in_scale, in_zp, packed, sums, scales_t, g,
                   padded(rw, bias))


def dq8ca_q4gsw_linear_rule(name: str = "quantized_linear_dq8ca_q4gsw") -> Rule:
    q = op("torchao.quantize_affine.default", capture("x"), any_value("in_block"),
           capture("in_scale"), capture("in_zp"), lit(torch.int8), -128, 127)
    dq = op("torchao.dequantize_affine.default", q, any_value("in_block"), capture("in_scale"),
            capture("in_zp"), lit(torch.int8), -128, 127)
    root = _linear(dq | op(VIEW, dq, any_value()).bind("in_view"), _w4())

    build = _dq8ca_build

    return Rule(
        name=name,
        pattern=root,
        constraints=[DtypeIn("x", frozenset({torch.float32})),
                     constraint("dynamic_per_token_input", hints=dynamic_per_token_operands)(_dynamic_per_token),
                     constraint("per_group_weight", hints=per_group_operands)(_per_group),
                     *_common_constraints(4, viewed_input=True), _q4_geometry(weight_only=False)],
        replacement=PythonReplacement(build),
        # at a root both routes match (a dynamically quantized input is also a float
        # tensor), the dynamic route is the one stock ExecuTorch takes
        priority=1,
        description="int8 dynamic per-token activation, torchao 4-bit weight linear into "
                    "et_vk.linear_dq8ca_q4gsw",
    )


def _q4gsw_float_input(ctx: CheckContext, x: Node) -> str | None:
    v: Any = x
    while isinstance(v, Node) and v.op == "call_function" and op_key(v.target) == VIEW:
        v = v.args[0]  # a 3-D linear's input is viewed to 2-D first
    if isinstance(v, Node) and v.op == "call_function" and "dequantize" in (op_key(v.target) or ""):
        return "the input is dequantized: not the weight-only route"
    return None


def _q4gsw_build(rw: Rewriter, x: Node, weight: Node, w_scales: Node, block_size: Any,
                 bias: Node | None = None) -> Node:
    packed, scales_t = _q4_constants(rw, weight, w_scales)
    return rw.call(et_vk("linear_q4gsw"), x, packed, scales_t, int(block_size[1]),
                   padded(rw, bias))


def q4gsw_linear_rule(name: str = "quantized_linear_q4gsw") -> Rule:
    root = _linear(capture("x"), _w4())

    float_input = constraint("float_input")(_q4gsw_float_input)
    build = _q4gsw_build

    return Rule(
        name=name,
        pattern=root,
        constraints=[float_input, DtypeIn("x", FP_T),
                     constraint("per_group_weight", hints=per_group_operands)(_per_group),
                     *_common_constraints(4), _q4_geometry(weight_only=True)],
        replacement=PythonReplacement(build),
        description="torchao 4-bit weight-only linear into et_vk.linear_q4gsw",
    )


@register_rules("vulkan_patterns", "vulkan", takes_over="quantized_linear",
                roots=("aten.addmm.default", "aten.bmm.default", "aten.linear.default",
                       "aten.mm.default", "quantized_decomposed.quantize_per_tensor.default"),
                needs=("quantized_decomposed.dequantize_per_channel.default",
                       "quantized_decomposed.dequantize_per_tensor.default",
                       "quantized_decomposed.quantize_per_tensor.default",
                       "torchao.dequantize_affine.default", "torchao.quantize_affine.default"))
def quantized_linear_rules() -> list[Rule]:
    from .quantized_embedding import import_quant_ops

    import_quant_ops()
    return [q8ta_linear_rule(), q8csw_linear_rule(), q4gsw_linear_rule(),
            dq8ca_q4gsw_linear_rule()]


__all__ = ["DQ_PER_TENSOR", "dq8ca_q4gsw_linear_rule", "per_group_sums", "q4gsw_linear_rule", "q8csw_linear_rule", "q8ta_linear_rule",
           "quantized_linear_rules"]




def _linear_input(pick: Pick, k: int, dtype: torch.dtype) -> OperandHint:
    """A linear's input with K in_channels: [M, K], or [1, M, K] (a bmm's batch of one)."""
    m = pick((1, 2, 3))
    return OperandHint(dtype=dtype, shapes=(pick(((m, k), (1, m, k))),))


def per_channel_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: an int8 linear the per-channel checks accept: an [N, K] weight
    in [-127, 127] (K a multiple of 4), one scale and a zero point of 0 per output channel
    along axis 0, a bias [N], an int8 input of K channels.

    N is a multiple of 4: the rules pad the scales and the bias to a multiple of 4 as the
    kernels read them, and the ops' CPU references (``custom_ops_lib.q8ta_linear``...) take
    the padded scales' length for N (3 output channels come out as 4).
    """
    n, k = pick((4, 8)), pick((4, 8))
    return {"x": _linear_input(pick, k, torch.int8),
            "weight": OperandHint(shapes=((n, k),), int_range=(-127, 127)),
            "w_scales": OperandHint(shapes=((n,),), fill="positive", dtype=torch.float32),
            "w_zp": OperandHint(shapes=((n,),), dtype=torch.int64),
            "axis": OperandHint(values=(0,)), "w_qmin": OperandHint(values=(-127, -128)),
            "bias": OperandHint(constant=True, shapes=((n,),), dtype=torch.float32)}


def per_group_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: a torchao 4-bit linear the 4-bit kernels' geometry admits:
    the group size G (a multiple of 4) first, K a multiple of 8 it tiles, N a multiple of 4;
    a weight [N, K] in [-8, 7], scales and zero points [N, K / G], a bias [N]."""
    group, n = pick((4, 8)), pick((4, 8))
    k = pick((8, 16))
    x = _linear_input(pick, k, torch.float32)
    per_token = [1] * (len(x.shapes[0]) - 1) + [k]
    return {"x": x, "in_block": OperandHint(values=(per_token,)),
            "weight": OperandHint(shapes=((n, k),), int_range=(-8, 7)),
            "w_scales": OperandHint(shapes=((n, k // group),), fill="positive", dtype=torch.float32),
            "w_zp": OperandHint(shapes=((n, k // group),), dtype=torch.int32),
            "block_size": OperandHint(values=([1, group],)),
            "bias": OperandHint(constant=True, shapes=((n,),), dtype=torch.float32)}


def float_activation_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: linear_q8ta_q8csw's input, the quantize of a float tensor
    with the dequantize's own parameters (what the rule gives the op: the float tensor).

    The float values are on the quantization grid: the op's CPU reference takes the float
    input as it is, where the kernel quantizes it first; on the grid both are the same."""
    return {"x": OperandHint(producer="quantize_per_tensor"), "in_scale": OperandHint(values=(0.5,)),
            "in_zp": OperandHint(values=(0,))}


#: the per-token codes' step: a power of two, so every code times it is exact in float32
_TOKEN_STEP = 1 / 16


def _on_the_token_grid(make: Any) -> Any:
    """A float input each row of which per-token int8 quantization holds exactly: codes in
    [-128, 127] times one step, each row reaching both ends (so the row's scale is the step
    and its zero point 0)."""
    codes = make.randint(-128, 127, make.shape)
    codes[..., 0], codes[..., -1] = -128, 127
    return make.input("codes", make.shape, torch.float32, codes.to(torch.float32) * _TOKEN_STEP)


def _per_token_qparams(make: Any) -> Any:
    """``choose_qparams_affine`` of the input, per token, int8 [-128, 127]: its scale (this
    capture) and its zero point (``in_zp``), as a dynamically quantized linear reads them."""
    x = make.capture("x")
    shape = make.value(x).shape
    block = [1] * (len(shape) - 1) + [shape[-1]]
    chosen = make.call(CHOOSE_QPARAMS, x, "ASYMMETRIC", block, torch.int8, -128, 127)
    make.bind("in_zp", make.item(chosen, 1))
    return make.item(chosen, 0)


def dynamic_per_token_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: an input quantized per token with the outputs of one
    ``choose_qparams_affine`` of it. Its values are on each row's quantization grid: the
    op's CPU reference (``custom_ops_lib.linear_dq8ca_q4gsw``) takes the float input as it
    is, where the kernel quantizes it per row first; on the grid both are the same."""
    return {"x": OperandHint(producer=_on_the_token_grid),
            "in_scale": OperandHint(producer=_per_token_qparams)}


