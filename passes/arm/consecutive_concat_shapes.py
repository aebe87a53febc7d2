"""``CONCAT_SHAPE([a, CONCAT_SHAPE([b, c]), d])`` -> ``CONCAT_SHAPE([a, b, c, d])``.

Takes over ``FuseConsecutiveConcatShapesPass`` (``_passes/fuse_consecutive_concat_shapes.py``,
ExecuTorch 1.5.1), which runs late in the TOSA pipeline (after ``SymbolicToTosaShapesPass``)
on programs with symbolic shapes (``TOSA-1.1+...+shape``): a shape built of shapes is
flattened into one ``tosa.CONCAT_SHAPE`` so the dim-order passes after it can permute
its elements. The flattening is recursive (stock re-traces in graph order, so an inner
concat is flat by the time the outer one is visited: the same list). The new concat takes
the outer one's metadata (its ``SHAPE`` special dtype included); an inner concat stays
for its other users and goes when it has none.

The stock pass is an ``ArmOpTargetedPass``: it re-traces the whole program whenever a
``CONCAT_SHAPE`` is in it, fused or not; the rule pass does not (it edits the graph in
place). On the symbolic-shape programs tried (``tests/test_arm_concat_shapes_dyt.py``)
the TOSA flatbuffer is byte-identical either way.

Constraints: at least one element is a ``CONCAT_SHAPE`` node; every element of the
flattened list is a shape (a node whose value is a list of ints / symbolic ints, or a
literal such list), and their lengths add up to the rank of the concat's own value (stock
takes every element on trust: a tensor operand or a nested concat of another length would
give a shape of a rank no later pass expects).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.registry import OperandHint
from fusionkit.targets import op_key

from ._common import (
    CONCAT_SHAPE,
    constraint,
    keep_node_meta,
    register_rules,  # (Arm's: its rules carry what the TOSA ops compute)
)


def _is_concat(arg: Any) -> bool:
    return isinstance(arg, Node) and arg.op == "call_function" and op_key(arg.target) == CONCAT_SHAPE


def flattened(shapes: Sequence[Any]) -> list[Any]:
    """The elements of ``shapes`` with every ``CONCAT_SHAPE`` node's own elements in its
    place, recursively."""
    out: list[Any] = []
    for arg in shapes:
        if _is_concat(arg) and isinstance(arg.args[0], (list, tuple)):
            out.extend(flattened(arg.args[0]))
        else:
            out.append(arg)
    return out


def _shape_length(arg: Any) -> int | None:
    """The number of dimensions a shape element holds (None: not a shape)."""
    value = arg.meta.get("val") if isinstance(arg, Node) else arg
    if not isinstance(value, (list, tuple)):
        return None
    if not all(isinstance(d, (int, torch.SymInt)) and not isinstance(d, bool) for d in value):
        return None
    return len(value)


def _nested(ctx: CheckContext, concat: Node, shapes: Any) -> str | None:
    if not isinstance(shapes, (list, tuple)) or not shapes:
        return f"the concat's operand {shapes!r} is no list of shapes"
    if not any(_is_concat(a) for a in shapes):
        return "no element is a CONCAT_SHAPE"
    if any(_is_concat(a) and not isinstance(a.args[0], (list, tuple)) for a in shapes):
        return "a nested CONCAT_SHAPE's operand is no list"
    total = 0
    for arg in flattened(shapes):
        n = _shape_length(arg)
        if n is None:
            return f"the element {getattr(arg, 'name', arg)!r} is no shape (a list of ints)"
        total += n
    rank = _shape_length(concat)
    if rank is None:
        return f"the concat's own value {concat.meta.get('val')!r} is no shape"
    if total != rank:
        return f"the flattened elements hold {total} dimensions, the concat {rank}"
    return None


def _fused(rw: Rewriter, concat: Node, shapes: Any) -> Node:
    rw.insert_at(concat)
    new = rw.call(concat.target, flattened(shapes))
    new.target = concat.target  # the backend dialect's op object itself, as stock writes it
    keep_node_meta(new, concat)
    new.meta["val"] = concat.meta.get("val")
    return new


#: for ``fusionkit.verify``: the concat's operand is a list of shapes (the generator would
#: draw a flat list of ints). The op takes and returns no tensor, so no eager call
#: dispatches it and a traced program holds it only with symbolic sizes
#: (``SymbolicToTosaShapesPass``): the verifier cannot build it, and says so
#: for fusionkit.verify: the nested shapes the check asks for
NESTED = {"shapes": OperandHint(values=([[1, 2], [3]],))}


@register_rules("arm", takes_over="FuseConsecutiveConcatShapesPass")
def consecutive_concat_shapes_rule() -> Rule:
    return Rule(
        name="arm_fuse_consecutive_concat_shapes",
        pattern=op(CONCAT_SHAPE, capture("shapes"), strict_defaults=False).bind("concat"),
        constraints=[constraint("nested_shapes", hints=NESTED)(_nested)],
        replacement=PythonReplacement(_fused),
        description="a shape concatenation of concatenations as one flat CONCAT_SHAPE",
    )


__all__ = ["consecutive_concat_shapes_rule", "flattened"]
