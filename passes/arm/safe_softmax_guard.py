"""``where(all(scores == -inf, dim), 0, softmax(scores, dim))`` -> ``softmax(scores, dim)``.

Takes over ``RemoveSafeSoftmaxGuardPass`` (``_passes/remove_safe_softmax_guard_pass.py``,
ExecuTorch 1.5.1), which Arm's pass manager runs only when the pipeline config's
``sdpa_safe_softmax_guard`` is ``REMOVE`` (the guard SDPA's decomposition puts around its
softmax; a row of only ``-inf`` scores then gives softmax's NaN instead of zeros: the
policy's stated trade-off). The guard's own ops are left dead, and go with the dead-code
sweep, as stock leaves them; one shared with another user stays.

Constraints, stated as stock checks them: the predicate is
``logical_not(any(logical_not(eq(scores, -inf)), dim, keepdim=True))`` over the scores
the softmax reads, along the softmax's dimension (a negative and a positive dim that are
the same axis agree); the zeros are ``full_like(softmax, 0)``; the ``where`` has the
softmax's dtype (a ``full_like`` of another dtype promotes it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.registry import OperandHint, Pick
from fusionkit.targets import op_key

from ._common import (
    constraint,
    register_rules,  # (Arm's: its rules carry what the TOSA ops compute)
)

WHERE = "aten.where.self"
SOFTMAX = "aten._softmax.default"
EQ = "aten.eq.Scalar"
LOGICAL_NOT = "aten.logical_not.default"
ANY_DIM = "aten.any.dim"
FULL_LIKE = "aten.full_like.default"


def _is(n: Any, key: str) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and op_key(n.target) == key


def _dtype(n: Node) -> torch.dtype | None:
    val = n.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _same_dim(softmax: Node, any_dim: Node) -> bool:
    """Stock's ``_same_dim``: equal, or the same axis of the softmax input's rank."""
    a, b = softmax.args[1], any_dim.args[1]
    if a == b:
        return True
    if not isinstance(a, int) or not isinstance(b, int):
        return False
    val = softmax.all_input_nodes[0].meta.get("val")
    rank = val.dim() if isinstance(val, torch.Tensor) else 0
    return rank > 0 and a % rank == b % rank


def _guard(ctx: CheckContext, where: Node, pred: Any, zeros: Any, softmax: Any) -> str | None:
    if not _is(softmax, SOFTMAX):
        return "the where's third operand is no softmax"
    if not (_is(zeros, FULL_LIKE) and zeros.args[0] is softmax and len(zeros.args) > 1
            and isinstance(zeros.args[1], (int, float)) and zeros.args[1] == 0):
        return "the where's second operand is no full_like(softmax, 0)"
    if _dtype(where) != _dtype(softmax):
        return f"the where computes in {_dtype(where)}, the softmax in {_dtype(softmax)}"
    if not _is(pred, LOGICAL_NOT):
        return "the predicate is no logical_not"
    any_dim = pred.args[0]
    if not (_is(any_dim, ANY_DIM) and len(any_dim.args) > 2 and any_dim.args[2] is True):
        return "the predicate does not reduce with any(dim, keepdim=True)"
    inner = any_dim.args[0]
    if not _is(inner, LOGICAL_NOT):
        return "the reduced value is no logical_not"
    eq = inner.args[0]
    if not _is(eq, EQ):
        return "the predicate does not compare the scores with eq"
    scores, neg_inf = eq.args[0], eq.args[1]
    if not isinstance(scores, Node):
        return "the compared scores are not a tensor"
    if not (isinstance(neg_inf, float) and neg_inf == -math.inf):
        return f"the scores are compared with {neg_inf!r}, not -inf"
    if softmax.args[0] is not scores:
        return f"the softmax reads `{softmax.args[0]}`, the guard `{scores.name}`"
    if not _same_dim(softmax, any_dim):
        return (f"the guard reduces dim {any_dim.args[1]}, the softmax normalises dim "
                f"{softmax.args[1]}")
    return None


def _softmax(rw: Rewriter, softmax: Node) -> Node:
    return softmax


@register_rules("arm", takes_over="RemoveSafeSoftmaxGuardPass")
def safe_softmax_guard_rule() -> Rule:
    return Rule(
        name="arm_remove_safe_softmax_guard",
        pattern=op(WHERE, capture("pred"), capture("zeros"), capture("softmax")).bind("where"),
        constraints=[constraint("safe_softmax_guard", hints=guard_operands)(_guard)],
        replacement=PythonReplacement(_softmax),
        description="SDPA's safe-softmax guard removed (policy REMOVE)",
    )


def _guarded_softmax(shape: tuple[int, ...], dim: int, any_dim: int) -> Any:
    """SDPA's guard over a softmax of fresh scores: the predicate (this capture), and the
    softmax and the zeros it binds. Some scores are -inf, never a whole row along ``dim``
    (there the guard gives zeros and the softmax NaN: the trade-off policy REMOVE states)."""

    def make_it(make: Any) -> Any:
        values = make.randint(-3, 3, shape).to(torch.float32)
        masked = make.randint(0, 2, shape) == 0
        masked.select(dim, 0).fill_(False)  # a finite score in every row
        scores = make.input("scores", shape, torch.float32, values.masked_fill(masked, -math.inf))
        softmax = make.call(SOFTMAX, scores, dim, False)
        make.bind("softmax", softmax)
        make.bind("zeros", make.call(FULL_LIKE, softmax, 0))
        eq = make.call(EQ, scores, -math.inf)
        found = make.call(ANY_DIM, make.call(LOGICAL_NOT, eq), any_dim, True)
        return make.call(LOGICAL_NOT, found)

    return make_it


def guard_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: the guard around a softmax over one of the scores' dims
    (the guard's dim negative or not)."""
    shape = tuple(pick((1, 2, 3)) for _ in range(pick((2, 3))))
    dim = pick(range(len(shape)))
    return {"pred": OperandHint(producer=_guarded_softmax(shape, dim,
                                                          pick((dim, dim - len(shape)))))}



__all__ = ["safe_softmax_guard_rule"]
