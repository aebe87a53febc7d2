"""Whether a HuggingFace RoPE cos/sin table provably has two equal halves.

ExecuTorch's Vulkan runtime computes ``et_vk.apply_rotary_emb_hf`` with the first half
of the last dim of ``freqs_cos``/``freqs_sin`` for both halves (its shader assumes the
tables are transformers' ``cat((freqs, freqs), -1)``; found on the real runtime, the op's
CPU reference reads the whole table). Fusing is only sound when the halves are equal:

* a constant whose two halves compare equal, or
* a value computed in the graph from ``cat([f, f], -1)`` (the same node twice) through
  ops that keep "second half == first half" true: elementwise ops whose other operands
  are scalars or duplicated too (``cos``, ``sin``, a scaling ``mul``, dtype casts), and
  views, slices, selects, indexing and expands on the other dims.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, op_key

from ._common import constant_tensor

#: elementwise ops: the result is duplicated when every tensor operand is
_ELEMENTWISE = frozenset({
    "aten.cos.default", "aten.sin.default", "aten.neg.default", "aten.exp.default",
    "aten.mul.Tensor", "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar",
    "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar",
    "aten._to_copy.default", "aten.clone.default", "aten.alias_copy.default",
    "dim_order_ops._to_dim_order_copy.default", "dim_order_ops._clone_dim_order.default",
})
#: ops that pick along a dim given by their second argument: sound unless it is the last
_ALONG_DIM = frozenset({"aten.slice_copy.Tensor", "aten.select_copy.int",
                        "aten.unsqueeze_copy.default", "aten.index_select.default"})
_CAT = "aten.cat.default"


def _rank(n: Any) -> int | None:
    t = n.meta.get("val") if isinstance(n, Node) else None
    return t.dim() if isinstance(t, torch.Tensor) else None


def _last_size(n: Any) -> int | None:
    t = n.meta.get("val") if isinstance(n, Node) else None
    return int(t.shape[-1]) if isinstance(t, torch.Tensor) and t.dim() else None


def _is_last(dim: Any, rank: int | None) -> bool:
    return not isinstance(dim, int) or rank is None or dim % max(rank, 1) == rank - 1


def _constant(ctx: CheckContext, n: Node) -> torch.Tensor | None:
    t = constant_tensor(ctx, n)
    if t is None and n.op == "get_attr" and isinstance(n.target, str):
        t = getattr(ctx.ep.graph_module, n.target, None)
    return t if isinstance(t, torch.Tensor) else None


def not_duplicated(ctx: CheckContext, n: Any, memo: dict[Node, str | None] | None = None
                   ) -> str | None:
    """None when ``n``'s last dim provably holds two equal halves; else why not."""
    memo = {} if memo is None else memo
    if not isinstance(n, Node):
        return None if not isinstance(n, torch.Tensor) else "a tensor literal"
    if n in memo:
        return memo[n]
    memo[n] = _why_not(ctx, n, memo)
    return memo[n]


def _why_not(ctx: CheckContext, n: Node, memo: dict[Node, str | None]) -> str | None:
    const = _constant(ctx, n)
    if const is not None:
        if const.dim() == 0 or const.shape[-1] == 1:
            return None  # a scalar or broadcast along the last dim
        half = const.shape[-1] // 2
        if const.shape[-1] % 2 == 0 and torch.equal(const[..., :half], const[..., half:]):
            return None
        return f"`{n.name}` is a constant whose two halves differ"
    if n.op != "call_function":
        return f"`{n.name}` is {ctx.inputs.describe(n)}: its halves cannot be shown equal"
    key = op_key(n.target)
    if key == _CAT:
        parts, dim = n.args[0], (n.args[1] if len(n.args) > 1 else 0)
        if (isinstance(parts, (list, tuple)) and len(parts) == 2 and parts[0] is parts[1]
                and _is_last(dim, _rank(n))):
            return None
        return f"`{n.name}` is a cat that is not cat([f, f], -1)"
    if key in _ELEMENTWISE:
        for a in (*n.args, *n.kwargs.values()):
            if isinstance(a, Node) and _last_size(a) not in (None, 1):
                why = not_duplicated(ctx, a, memo)
                if why is not None:
                    return why
        return None
    if key in _ALONG_DIM:
        dim = n.args[1] if len(n.args) > 1 else 0
        rank = _rank(n) if key == "aten.unsqueeze_copy.default" else _rank(n.args[0])
        if _is_last(dim, rank):
            return f"`{n.name}` ({key}) works on the last dim"
        return not_duplicated(ctx, n.args[0], memo)
    if key == "aten.index.Tensor":
        idx = n.args[1] if len(n.args) > 1 else []
        rank = _rank(n.args[0])
        if not isinstance(idx, (list, tuple)) or rank is None or len(idx) >= rank:
            return f"`{n.name}` (index) may index the last dim"
        return not_duplicated(ctx, n.args[0], memo)
    if key == "aten.expand_copy.default":
        if _last_size(n.args[0]) != _last_size(n):
            return f"`{n.name}` (expand) changes the last dim"
        return not_duplicated(ctx, n.args[0], memo)
    return f"`{n.name}` ({key}) is not an op that keeps equal halves equal"


__all__ = ["not_duplicated"]
