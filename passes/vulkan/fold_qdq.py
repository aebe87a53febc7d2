"""A dequantize of a quantize is the quantized value itself: its users read that value.

Replaces ``FoldQDQPass`` (``executorch/backends/vulkan/_passes/fold_qdq.py``, run by
``VulkanBackend.preprocess`` of ExecuTorch 1.5.1 after the quantized patterns were
fused): what is left of the PT2E quantize -> dequantize chains runs in float. The stock
pass visits every quantize node and reroutes the users of each of its dequantize users
to the quantize's input; a quantize read by something else (a fused ``et_vk.q8ta_*``
op) stays.

Here the root is the dequantize (``dequantize(q, ...)``, one match per dequantize, so a
quantize with several dequantize users folds them all in one round); the quantize is a
capture, not part of the match, because its other users keep it. The stock pass's own
tests are the constraint: ``q`` is a quantize (``utils.is_quant_node``'s op names) whose
input is a graph value. What it forgets, declined here before anything changes: the
dequantize's value must have the quantize input's dtype and shape (a ``dequantize(...,
out_dtype=float16)`` of a float32 value is a cast the stock pass drops). Nothing is
checked of the scales and zero points, as in the stock pass: folding means running the
chain in float whatever its parameters.

The stock pass ends with FX dead-code elimination and an ``ExportPass`` retrace; the
rule rewrites in place (the adapter's ``RulePass`` runs the dead-code elimination).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    MatchResult,
    PythonReplacement,
    Rewriter,
    Rule,
    capture,
    op,
    op_key,
)
from fusionkit.passes.registry import register_rules

from ._common import constraint

STOCK_PASS = "FoldQDQPass"

#: ``executorch.backends.vulkan.utils._Q_OPS`` / ``_DQ_OPS`` with their namespaces (the
#: stock test compares the overload name only; these are the ops with those names)
Q_OPS: tuple[str, ...] = (
    "quantized_decomposed.quantize_per_tensor.default",
    "quantized_decomposed.quantize_per_tensor.tensor",
    "quantized_decomposed.quantize_per_channel.default",
    "quantized_decomposed.quantize_per_token.default",
    "torchao.quantize_affine.default",
)
DQ_OPS: tuple[str, ...] = (
    "quantized_decomposed.dequantize_per_tensor.default",
    "quantized_decomposed.dequantize_per_tensor.tensor",
    "quantized_decomposed.dequantize_per_channel.default",
    "quantized_decomposed.dequantize_per_channel_group.default",
    "quantized_decomposed.dequantize_per_token.default",
    "torchao.dequantize_affine.default",
)


def _load_quantized_ops() -> None:
    """The op namespaces register when their libraries are imported."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (quantized_decomposed)

    try:
        import torchao.quantization.quant_primitives  # noqa: F401  (torchao.*_affine)
    except ImportError:  # pragma: no cover - torchao is an ExecuTorch dependency
        pass


def _known(names: tuple[str, ...]) -> tuple[str, ...]:
    from fusionkit.match.targets import resolve_op

    out = []
    for n in names:
        try:
            resolve_op(n)
        except Exception:  # an op library not installed: no graph can hold that op
            continue
        out.append(n)
    return tuple(out)


def _value(n: Any) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _folds_a_quantize(ctx: CheckContext, q: Any) -> str | MatchResult | None:
    """``q`` is a quantize of a graph value with the dequantize's dtype and shape."""
    dq = ctx.root
    if not (isinstance(q, Node) and q.op == "call_function" and op_key(q.target) in Q_OPS):
        what = getattr(q, "name", repr(q))
        return ctx.fail(f"`{what}` is not a quantize: `{dq.name}` dequantizes a stored value",
                        at="q")
    src = q.args[0] if q.args else None
    if not isinstance(src, Node):
        return ctx.fail(f"quantize `{q.name}` has no graph value as input", at="q")
    a, b = _value(src), _value(dq)
    if a is None or b is None:
        return f"`{src.name}` or `{dq.name}` has no tensor value"
    if a.dtype != b.dtype:
        return (f"`{dq.name}` gives {b.dtype} but the quantized value `{src.name}` is "
                f"{a.dtype}: dropping the pair would change the dtype its users read")
    if a.shape != b.shape:
        return f"`{dq.name}` has the shape {list(b.shape)}, `{src.name}` {list(a.shape)}"
    return None


def _quantized_value(rw: Rewriter, q: Node) -> Node:
    src = q.args[0]
    assert isinstance(src, Node)  # the constraint
    return src


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def fold_qdq_rules() -> list[Rule]:
    """``dequantize(quantize(x))`` -> ``x`` (each dequantize user of a quantize)."""
    _load_quantized_ops()
    q_ops, dq_ops = _known(Q_OPS), _known(DQ_OPS)
    assert q_ops and dq_ops, "quantized_decomposed ops not registered"
    return [
        Rule(name="fold_qdq",
             pattern=op(dq_ops, capture("q"), strict_defaults=False),
             constraints=[constraint("folds_a_quantize")(_folds_a_quantize)],
             replacement=PythonReplacement(_quantized_value),
             description="a dequantize of a quantize reads the quantized value in float"),
    ]


__all__ = ["DQ_OPS", "Q_OPS", "STOCK_PASS", "fold_qdq_rules"]
