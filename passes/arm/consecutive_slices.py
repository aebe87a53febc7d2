"""``SLICE(SLICE(x, start1, size1), start2, size2)`` -> ``SLICE(x, start1 + start2, size2)``.

Takes over ``FuseConsecutiveSlicesPass`` (``_passes/fuse_consecutive_slices_pass.py``,
ExecuTorch 1.5.1), which runs right after ``RewriteSlicePass`` made every slice a
``tosa.SLICE`` with ``tosa.CONST_SHAPE`` operands. The new slice reads the first one's
input with the summed start and the second one's size, through two new ``CONST_SHAPE``
nodes, and takes the second slice's metadata (qparams included), as stock builds it; the
first slice stays for its other users and goes when it has none.

Constraints: both slices' starts and the second one's size are constant shapes of
integers, of one rank. What stock forgets: the rank of the input (a start list of another
rank than the tensor it slices) and that the fused window lies inside the input (start
>= 0, start + size <= the input's extent, on every static dimension): stock takes both
on trust from the two slices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.registry import OperandHint, Pick
from fusionkit.targets import op_key

from ._common import (
    CONST_SHAPE,
    SLICE,
    constraint,
    keep_node_meta,
    register_rules,  # (Arm's: its rules carry what the TOSA ops compute)
)


def _constant_shape(arg: Any) -> list[int] | None:
    """Stock's ``_constant_shape``: a CONST_SHAPE node's (or a literal) list of ints."""
    if isinstance(arg, Node):
        if op_key(arg.target) != CONST_SHAPE:
            return None
        arg = arg.args[0]
    if not isinstance(arg, Sequence) or isinstance(arg, str):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in arg):
        return None
    return list(arg)


def _fusable(ctx: CheckContext, inner: Any, start2: Any, size2: Any) -> str | None:
    if not isinstance(inner, Node) or op_key(inner.target) != SLICE:
        return f"the slice's input {getattr(inner, 'name', inner)!r} is no slice"
    s1, s2, z2 = _constant_shape(inner.args[1]), _constant_shape(start2), _constant_shape(size2)
    if s1 is None or s2 is None or z2 is None:
        return "a start or size is not a constant shape (a dynamic slice)"
    if not len(s1) == len(s2) == len(z2):
        return f"starts / size of ranks {len(s1)}, {len(s2)}, {len(z2)}"
    x = inner.args[0]
    val = x.meta.get("val") if isinstance(x, Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != len(s1):
        return (f"the sliced input is of rank {getattr(val, 'ndim', None)}, the slices of "
                f"rank {len(s1)}")
    for d, (a, b, z, extent) in enumerate(zip(s1, s2, z2, val.shape, strict=True)):
        if isinstance(extent, int) and not (0 <= a + b and a + b + z <= extent):
            return f"the fused window [{a + b}, {a + b + z}) of dim {d} leaves [0, {extent})"
    return None


def _const_shape(rw: Rewriter, target: Any, shape: list[int]) -> Node:
    from executorch.backends.arm.tosa.mapping import TosaSpecialDtype

    node = rw.call(target, shape)
    node.target = target  # the backend dialect's op object itself, as stock writes it
    node.meta["val"] = shape
    node.meta[TosaSpecialDtype.meta_key()] = TosaSpecialDtype.SHAPE
    return node


def _fused(rw: Rewriter, outer: Node, inner: Node, size2: Any) -> Node:
    rw.insert_at(outer)
    start = [a + b for a, b in zip(_constant_shape(inner.args[1]) or [],
                                   _constant_shape(outer.args[1]) or [], strict=True)]
    shape_op = inner.args[1].target if isinstance(inner.args[1], Node) else None
    if shape_op is None:  # literal shapes: the dialect's CONST_SHAPE
        from executorch.exir.dialects._ops import ops as exir_ops

        shape_op = exir_ops.backend.tosa.CONST_SHAPE.default
    start_node = _const_shape(rw, shape_op, start)
    size_node = _const_shape(rw, shape_op, list(_constant_shape(size2) or []))
    new = rw.call(outer.target, inner.args[0], start_node, size_node)
    new.target = outer.target
    keep_node_meta(new, outer)
    return new


def slice_of_a_slice(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: ``inner`` a SLICE of a drawn int8 or float input, and the
    outer start/size of its rank, a window inside the inner slice (both windows drawn
    per dim: a start, then a size that fits)."""
    rank = pick((1, 2, 3))
    extents = [pick((2, 3, 5)) for _ in range(rank)]
    start1, size1, start2, size2 = [], [], [], []
    for extent in extents:
        s1 = pick(range(extent))
        z1 = pick(range(1, extent - s1 + 1))
        s2 = pick(range(z1))
        start1.append(s1)
        size1.append(z1)
        start2.append(s2)
        size2.append(pick(range(1, z1 - s2 + 1)))
    dtype = pick((torch.int8, torch.float32))

    def inner_slice(make: Any) -> Any:
        x = make.input("x", tuple(extents), dtype)
        return make.call(SLICE, x, start1, size1)

    return {"inner": OperandHint(producer=inner_slice), "start2": OperandHint(values=(start2,)),
            "size2": OperandHint(values=(size2,))}




@register_rules("arm", takes_over="FuseConsecutiveSlicesPass")
def consecutive_slices_rule() -> Rule:
    return Rule(
        name="arm_fuse_consecutive_slices",
        pattern=op(SLICE, capture("inner"), capture("start2"), capture("size2"),
                   strict_defaults=False).bind("outer"),
        constraints=[constraint("static_window", hints=slice_of_a_slice)(_fusable)],
        replacement=PythonReplacement(_fused),
        description="a slice of a slice as one slice of the first one's input",
    )


__all__ = ["consecutive_slices_rule", "slice_of_a_slice"]
