"""An identity clone -> its input; a dequantize -> clone -> quantize with one set of
parameters -> the quantized value itself.

Takes over ``XNNPACKRemoveCloneOpsTransform`` (``_passes/__init__.py``: ExecuTorch
1.5.1's ``transforms/remove_clone_ops.py`` ``RemoveCloneOpsTransform`` with
``preserve_input_output_copies=True``), the first pass of XNNPACK's preprocess: a
``clone`` / ``_clone_dim_order`` that keeps the memory layout copies for nothing, so
its users read its input. When that input is a dequantize, the quantize users of the
dequantize (those of the clone included) with the dequantize's own parameters
(``args[1:]``, as ``eliminate_dq_q`` compares them) are the identity ``q(dq(t)) == t``:
their users read ``t`` and they go.

What the stock pass checks inline, stated as constraints: the clone is an identity
(``clone``: no memory format, ``preserve_format``, or an input already contiguous in
that format; ``_clone_dim_order``: the output's dim order is the input's; a value
without metadata counts as an identity, as the stock test says), and a clone that
copies a graph input straight to a graph output stays (the delegate must write its
output; ``preserve_input_output_copies``).

What it forgets: a quantize it removes may be a program output; ``eliminate_dq_q``
reroutes the output node to the quantized input and leaves the output signature naming
the quantize. Here such a quantize stays (the clone still goes). Nothing else found.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import CheckContext, PythonReplacement, Rewriter, Rule, capture, op, op_key
from fusionkit.passes.registry import register_rules

from ._common import constraint

CLONE = "aten.clone.default"
CLONE_DIM_ORDER = "dim_order_ops._clone_dim_order.default"
CLONE_OPS: tuple[str, ...] = (CLONE, CLONE_DIM_ORDER)

#: ``exir/passes/remove_noop_pass.py`` ``_DEQUANT_OPS`` / ``_QUANT_OPS`` (both dialects)
DEQUANT_OPS = frozenset({"quantized_decomposed.dequantize_per_tensor.default",
                         "quantized_decomposed.dequantize_per_channel.default"})
QUANT_OPS = frozenset({"quantized_decomposed.quantize_per_tensor.default",
                       "quantized_decomposed.quantize_per_channel.default"})


def _is_call(n: Any, names: frozenset[str]) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and op_key(n.target) in names


def _changed_layout(clone: Node, x: Any) -> str | None:
    """Why ``clone`` is not an identity (the stock ``_is_non_identity_clone``), else None."""
    src = x.meta.get("val") if isinstance(x, Node) else None
    if op_key(clone.target) == CLONE:
        fmt: Any = clone.kwargs.get("memory_format")
        if fmt in (None, torch.preserve_format) or not isinstance(src, torch.Tensor):
            return None
        if src.is_contiguous(memory_format=fmt):
            return None
        return f"`{clone.name}` copies its input into {fmt}: a layout change, not an identity"
    out = clone.meta.get("val")
    if isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor):
        if out.dim_order() != src.dim_order():
            return (f"`{clone.name}` changes the dim order {src.dim_order()} to "
                    f"{out.dim_order()}: not an identity")
    return None


def _identity_clone(ctx: CheckContext, clone: Node, x: Any) -> Any:
    reason = _changed_layout(clone, x)
    if reason is not None:
        return ctx.fail(reason, at="clone")
    if (isinstance(x, Node) and x.op == "placeholder"
            and any(u.op == "output" for u in clone.users)):
        return ctx.fail(f"`{clone.name}` copies graph input `{x.name}` to a graph output: the "
                        "delegate must write that output (preserve_input_output_copies)",
                        at="clone")
    return None


def _requantizations(dq: Node, clone: Node) -> list[Node]:
    """The quantize users of ``dq`` -- once the clone's users read it -- that undo it."""
    params = list(dq.args)[1:]
    users = [*(u for u in dq.users if u is not clone), *clone.users]
    return [u for u in users if _is_call(u, QUANT_OPS) and list(u.args)[1:] == params
            and not any(w.op == "output" for w in u.users)]


def _input(rw: Rewriter, clone: Node, x: Node) -> Node:
    if _is_call(x, DEQUANT_OPS):
        quantized = x.args[0]
        assert isinstance(quantized, Node)
        for q in _requantizations(x, clone):
            rw.reroute(q, quantized)
            rw.erase(q)
    return x


@register_rules("xnnpack", takes_over="XNNPACKRemoveCloneOpsTransform")
def remove_clone_rule() -> Rule:
    return Rule(
        name="xnnpack_remove_identity_clone",
        pattern=op(CLONE_OPS, capture("x"), strict_defaults=False).bind("clone"),
        constraints=[constraint("identity_clone")(_identity_clone)],
        replacement=PythonReplacement(_input),
        description="a clone keeping the layout is its input (with the Q/DQ pairs it leaves)",
    )


__all__ = ["CLONE_OPS", "remove_clone_rule"]
