"""``RESCALE(int32 -> int8/int16)`` then ``RESCALE(int8/int16 -> int32)`` composing to the
identity -> the first one's int32 input.

Takes over ``FuseConsecutiveRescalesPass`` (``_passes/fuse_consecutive_rescales_pass.py``,
ExecuTorch 1.5.1): ``InsertRescaleInt32Pass`` wraps each quantized arithmetic op in
rescales, so two chained ops leave an int32 -> int8 -> int32 round trip. When the two
scales multiply to 1 (within 1e-6) and the zero points line up, the second rescale's
users read the first one's input (the first stays for any other user; a dead one goes).
As in stock, a pair that is not the identity is left (Vela mis-compiles int32 -> int32
rescales), and bypassing the int8 clamp is Arm's accepted trade-off (at most one step on
typical data; its tests use ``qtol=1``).

Constraints: the first rescale is per tensor, int32 in, int8/int16 out; the second is per
tensor, int32 out, reads the first one's output zero point; the scales compose to 1 and
the zero points to the identity. What stock forgets: the signedness flags
(``output_unsigned`` of the first, ``input_unsigned`` of the second): the same zero point
read as uint8 by one and int8 by the other is no identity.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.registry import OperandHint, Pick
from fusionkit.targets import op_key

from ._common import (
    RESCALE,
    constraint,
    register_rules,  # (Arm's: its rules carry what the TOSA ops compute)
)

#: how close the composed scale must be to 1 (stock's tolerance)
SCALE_TOLERANCE = 1e-6


def _dtype(v: Any) -> torch.dtype | None:
    val = v.meta.get("val") if isinstance(v, Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _first_rescale(r1: Any) -> str | None:
    """Why ``r1`` is no int32 -> int8/int16 per-tensor rescale, or None."""
    if not isinstance(r1, Node) or op_key(r1.target) != RESCALE:
        return f"the rescale's input {getattr(r1, 'name', r1)!r} is no rescale"
    if len(r1.args) < 5:
        return f"`{r1.name}` has {len(r1.args)} arguments, not 5"
    if r1.args[1] not in (torch.int8, torch.int16):
        return f"`{r1.name}` rescales to {r1.args[1]}, not int8/int16"
    if not isinstance(r1.args[2], (list, tuple)) or len(r1.args[2]) != 1:
        return f"`{r1.name}` is not per tensor"
    if _dtype(r1.args[0]) != torch.int32:
        return f"`{r1.name}` reads {_dtype(r1.args[0])}, not int32"
    return None


def _identity_pair(ctx: CheckContext, r1: Any, r2: Node, dtype: Any, scale: Any,
                   in_zp: Any, out_zp: Any) -> str | None:
    why = _first_rescale(r1)
    if why is not None:
        return why
    if dtype != torch.int32:
        return f"`{r2.name}` rescales to {dtype}, not int32"
    if not isinstance(scale, (list, tuple)) or len(scale) != 1:
        return f"`{r2.name}` is not per tensor"
    if r1.args[4] != in_zp:
        return f"`{r1.name}` writes zero point {r1.args[4]}, `{r2.name}` reads {in_zp}"
    composed = float(r1.args[2][0]) * float(scale[0])
    if abs(composed - 1.0) >= SCALE_TOLERANCE:
        return f"the scales compose to {composed}, not 1"
    if r1.args[3] != out_zp:
        return f"zero points {r1.args[3]} in, {out_zp} out: not the identity"
    wrote = bool(r1.kwargs.get("output_unsigned", False))
    read = bool(r2.kwargs.get("input_unsigned", False))
    if wrote != read:
        return (f"`{r1.name}` writes {'un' if wrote else ''}signed values, `{r2.name}` reads "
                f"them as {'un' if read else ''}signed")
    if bool(r1.kwargs.get("input_unsigned", False)) != bool(
            r2.kwargs.get("output_unsigned", False)):
        return "the int32 ends of the pair differ in signedness"
    return None


def _first_input(rw: Rewriter, r1: Node) -> Any:
    return r1.args[0]


def identity_round_trip(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: ``r1`` an int32 -> int8/int16 RESCALE (scale 1, 1/2 or
    1/4; int8 zero point 0, 3 or -5) of int32 values on its grid (``(k - zp) / scale`` for
    ``k`` in the output range: the round trip is exact there), and the second rescale's
    inverse scale and zero points. Off the grid the pair rounds and clamps where the fold
    does not: Arm's accepted trade-off, not judged."""
    dtype = pick((torch.int8, torch.int16))
    scale = pick((1.0, 0.5, 0.25))
    zp = pick((0, 3, -5)) if dtype == torch.int8 else 0
    lo, hi = (-128, 127) if dtype == torch.int8 else (-32768, 32767)
    shape = pick(((4,), (2, 3), (1, 2, 2)))

    def first_rescale(make: Any) -> Any:
        codes = make.randint(lo, hi, shape)
        x = make.input("x", shape, torch.int32, ((codes - zp) / scale).to(torch.int32))
        return make.call(RESCALE, x, dtype, [scale], 0, zp)

    return {"r1": OperandHint(producer=first_rescale), "dtype": OperandHint(values=(torch.int32,)),
            "scale": OperandHint(values=([1.0 / scale],)), "in_zp": OperandHint(values=(zp,)),
            "out_zp": OperandHint(values=(0,))}




@register_rules("arm", takes_over="FuseConsecutiveRescalesPass")
def consecutive_rescales_rule() -> Rule:
    return Rule(
        name="arm_fuse_identity_rescales",
        pattern=op(RESCALE, capture("r1"), capture("dtype"), capture("scale"),
                   capture("in_zp"), capture("out_zp"), strict_defaults=False).bind("r2"),
        constraints=[constraint("identity_pair", hints=identity_round_trip)(_identity_pair)],
        replacement=PythonReplacement(_first_input),
        description="an int32->int8->int32 rescale pair composing to the identity",
    )


__all__ = ["consecutive_rescales_rule", "identity_round_trip"]
