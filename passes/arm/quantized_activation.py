"""A relu (or ``hardtanh(0, max)``) between a conv / linear and its quantize -> the
quantize's own clamp.

Takes over ``FuseQuantizedActivationPass`` (``_passes/fuse_quantized_activation_pass.py``,
ExecuTorch 1.5.1, first in Arm's TOSA pipeline, before q/dq folding): in
``conv -> relu -> quantize_per_tensor(scale, zp, qmin, qmax)`` the relu is what a quantize
with ``qmin = zp`` does anyway (``dequantize(zp) == 0``), so the relu goes and the quantize's
``qmin`` becomes the zero point.

Constraints: the conv / linear (kept as it is) and the activation have no other user
(stock counts both too); the quantize is per tensor with integer bounds and zero point; its
zero point is at or below its ``qmin`` (the quantized range starts at or above real 0, so
the relu removes nothing the quantize keeps); a hardtanh's lower bound is 0 and its upper
bound quantizes to ``qmax`` (the quantize's upper clamp is then the hardtanh's).

What stock forgets: that nothing later in the TOSA pipeline clamps to the quantize's
``qmin``. The quantize is folded into the conv / linear's output parameters and lowered to
a ``RESCALE``, which saturates to the int8 range, not to ``qmin``; no ``CLAMP`` is emitted.
So where the zero point is above ``qmin`` -- a relu whose output shares its quantization
with other tensors, e.g. the inputs of a ``cat`` (Arm's quantizer gives them one scale and
zero point) -- stock's ``qmin = zp`` is dropped and the negative values the relu removed
come back (``tests/test_arm_quantized_activation.py``: 96 output steps off the
fake-quantized model); the rule declines and the relu is lowered as a clamp. Where it
fuses, ``qmin`` is kept (stock writes ``zp`` over it, widening a tighter ``qmin``).
A hardtanh with its bounds as keyword arguments is read by schema (stock indexes
``args[1]``).
"""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.registry import OperandHint
from fusionkit.targets import op_key

from ._common import (
    CONV,
    HARDTANH,
    LINEAR,
    Q_PER_TENSOR,
    RELU,
    constraint,
    is_number,
    keep_node_meta,
    register_rules,  # (Arm's: its rules carry what the TOSA ops compute)
)


def _quantized(x: float, scale: float, zp: int, qmin: int, qmax: int, dtype: Any) -> int:
    """``x`` through the quantize itself (what Arm's ``QuantArgs.quantize_value`` does)."""
    import torch.ao.quantization.fx._decomposed

    q = torch.ops.quantized_decomposed.quantize_per_tensor(
        torch.tensor([x], dtype=torch.float32), scale, zp, qmin, qmax, dtype)
    return int(q.item())


def _fusable_input(ctx: CheckContext, pre: Any) -> str | None:
    """The activation's input is a conv / linear read by the activation alone (it is kept)."""
    if not isinstance(pre, Node) or op_key(pre.target) not in (CONV, LINEAR):
        return f"the activation's input {getattr(pre, 'name', pre)!r} is no convolution or linear"
    if len(pre.users) != 1:
        return f"`{pre.name}` has {len(pre.users)} users: the activation is not its only one"
    return None


def _per_tensor(ctx: CheckContext, scale: Any, zp: Any, qmin: Any, qmax: Any) -> str | None:
    if not isinstance(scale, float) or not all(isinstance(v, int) for v in (zp, qmin, qmax)):
        return (f"the quantize's scale / zero point / bounds ({scale!r}, {zp!r}, {qmin!r}, "
                f"{qmax!r}) are not per-tensor numbers")
    if not scale > 0:  # a negative scale maps real values below 0 above the zero point
        return (f"the quantize's scale {scale!r} is not positive: real values below 0 do not "
                "quantize below its zero point, so the activation is not its clamp")
    return None


def _range_covers_activation(ctx: CheckContext, zp: Any, qmin: Any) -> str | None:
    """The quantize keeps no value below real 0 (``zp <= qmin``): the activation's clamp at
    0 is the quantize's own, so removing it changes nothing later passes compute."""
    if zp > qmin:
        return (f"the quantize's zero point {zp} is above its qmin {qmin}: the activation "
                "clips values the quantization keeps (its scale and zero point are shared, "
                "e.g. with a cat's other inputs), and the TOSA lowering clamps the output to "
                "the int8 range, not to a quantize's qmin")
    return None


def _hardtanh_bounds(ctx: CheckContext, lo: Any, hi: Any, scale: Any, zp: Any, qmin: Any,
                     qmax: Any, dtype: Any) -> str | None:
    if not (is_number(lo) and is_number(hi)):
        return f"hardtanh bounds ({lo!r}, {hi!r}) are not numbers"
    if lo != 0:
        return f"hardtanh's lower bound is {lo}, not 0: the quantize's clamp is not it"
    top = _quantized(hi, scale, zp, qmin, qmax, dtype)
    if top != qmax:
        return (f"hardtanh's upper bound {hi} quantizes to {top}, not qmax {qmax}: the "
                "quantize's clamp is not it")
    return None


def _requantized(rw: Rewriter, q: Node, pre: Node, scale: float, zp: int, qmin: int,
                 qmax: int, dtype: Any) -> Node:
    rw.insert_at(q)
    new = rw.call(q.target, pre, scale, zp, qmin, qmax, dtype, **q.kwargs)
    keep_node_meta(new, q)
    return new


def _relu_rule() -> Rule:
    pre = capture("pre")
    return Rule(
        name="arm_fuse_quantized_relu",
        pattern=op(Q_PER_TENSOR, op(RELU, pre), capture("scale"), capture("zp"),
                   capture("qmin"), capture("qmax"), capture("dtype")).bind("q"),
        constraints=[constraint("fusable_input", hints={"pre": OperandHint(producer="linear")})(_fusable_input),
                     constraint("per_tensor", hints=POSITIVE_SCALE_AND_NOT)(_per_tensor),
                     constraint("range_covers_activation", hints=ZERO_POINT_AT_QMIN_AND_NOT)(_range_covers_activation)],
        replacement=PythonReplacement(_requantized),
        description="relu before a per-tensor quantize whose range starts at 0 (zp <= qmin)")


#: operands for fusionkit.verify: a quantize that keeps nothing below 0 (zero point at qmin),
#: and one that does (declined)
ZERO_POINT_AT_QMIN_AND_NOT = {"zp": OperandHint(values=(-128, 0)), "qmin": OperandHint(values=(-128,))}
#: ... with a positive scale, and one that is not (declined: real values below 0 would not
#: quantize below the zero point)
POSITIVE_SCALE_AND_NOT = {"scale": OperandHint(values=(0.5, 0.25, -0.5))}
#: hardtanh(0, hi) folded into a quantize whose qmax hi quantizes to: a bound far enough to
#: saturate at qmax for the drawn scales (0.25, 0.5), and one that does not
SATURATING_BOUND_AND_NOT = {"lo": OperandHint(values=(0.0,)), "hi": OperandHint(values=(1000.0, 6.0))}


def _hardtanh_rule() -> Rule:
    pre = capture("pre")
    return Rule(
        name="arm_fuse_quantized_hardtanh",
        pattern=op(Q_PER_TENSOR, op(HARDTANH, pre, capture("lo"), capture("hi")),
                   capture("scale"), capture("zp"), capture("qmin"), capture("qmax"),
                   capture("dtype")).bind("q"),
        constraints=[constraint("fusable_input", hints={"pre": OperandHint(producer="linear")})(_fusable_input),
                     constraint("per_tensor", hints=POSITIVE_SCALE_AND_NOT)(_per_tensor),
                     constraint("range_covers_activation", hints=ZERO_POINT_AT_QMIN_AND_NOT)(_range_covers_activation),
                     constraint("quantize_clamp", hints=SATURATING_BOUND_AND_NOT)(_hardtanh_bounds)],
        replacement=PythonReplacement(_requantized),
        description="hardtanh(0, max) before a per-tensor quantize whose qmax is max")


@register_rules("arm", takes_over="FuseQuantizedActivationPass")
def quantized_activation_rules() -> list[Rule]:
    return [_relu_rule(), _hardtanh_rule()]


__all__ = ["quantized_activation_rules"]
