"""A max pool or ``max.dim`` read only for its values -> the op computing just the values.

Takes over ``RemoveGetItemPass`` (``backends/transforms/remove_getitem_op.py``, ExecuTorch
1.5.1): ``getitem(max_pool2d_with_indices(x, ...), 0)`` becomes ``max_pool2d(x, ...)`` and
``getitem(max.dim(x, dim, keepdim), 0)`` becomes ``amax(x, dim, keepdim)`` (the same
arguments), the op XNNPACK serializes. The new op keeps the old one's metadata (debug
handle included), as the stock pass copies it.

What the stock pass checks inline, stated as a constraint: the op's only user is a
``getitem`` of output 0. What it does otherwise: ``max.dim`` with two users is left for
XNNPACK's ``max.dim`` visitor (declined here alike), and every other use -- the indices
read, three users -- raises an ``AssertionError`` that ends the user's lowering; here
those matches are declined with the reason and the op is left as it is (XNNPACK's
partitioner admits a ``max.dim`` only when all its users read the values, so its
visitor meets only what it handles).
"""

from __future__ import annotations

import operator
from typing import Any

from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, capture, op, op_key
from fusionkit.passes.registry import register_rules

from ._common import constraint, keep_provenance
from ._getitem import read_through_getitems

MAX_POOL_WITH_INDICES = "aten.max_pool2d_with_indices.default"
MAX_DIM = "aten.max.dim"
#: the op computing only the values, by op
VALUES_ONLY: dict[str, str] = {MAX_POOL_WITH_INDICES: "aten.max_pool2d.default",
                               MAX_DIM: "aten.amax.default"}


def _values_only(ctx: CheckContext, with_indices: Node) -> Any:
    users = list(with_indices.users)
    name = f"`{with_indices.name}` ({op_key(with_indices.target)})"
    if len(users) != 1:
        return ctx.fail(f"{name} has {len(users)} users: only one reading its values is "
                        "rewritten (XNNPACK's max.dim visitor takes values and indices)",
                        at="with_indices")
    user = users[0]
    if not (user.op == "call_function" and user.target is operator.getitem):
        return ctx.fail(f"{name} is read by `{user.name}`, not a getitem", at="with_indices")
    if user.args[1] != 0:
        return ctx.fail(f"{name}'s indices (output {user.args[1]}) are read: XNNPACK computes "
                        "only the values", at="with_indices")
    return None


def _values_op(rw: Rewriter, with_indices: Node) -> Node:
    target = VALUES_ONLY[str(op_key(with_indices.target))]
    rw.insert_at(with_indices)  # where the stock pass puts it
    new = rw.call(target, *with_indices.args, **with_indices.kwargs)
    keep_provenance(new, with_indices)
    return read_through_getitems(rw, new)  # its getitem(., 0) reads the new op


@register_rules("xnnpack", takes_over="RemoveGetItemPass")
def remove_getitem_rule() -> Rule:
    return Rule(
        name="xnnpack_values_only_max",
        pattern=op(tuple(VALUES_ONLY), capture("x"), strict_defaults=False).bind("with_indices"),
        constraints=[constraint("values_only")(_values_only)],
        replacement=PythonReplacement(_values_op),
        description="max pool / max.dim read only for its values as max_pool2d / amax",
    )


__all__ = ["VALUES_ONLY", "remove_getitem_rule"]
