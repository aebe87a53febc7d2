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
input is a graph value. What it forgets, declined here before anything changes:

* the dequantize's value must have the quantize input's dtype and shape (a ``dequantize(...,
  out_dtype=float16)`` of a float32 value is a cast the stock pass drops);
* the dequantize reads the codes with the quantize's own parameters (the same kind of
  quantization, scales, zero points, axis or blocks and code dtype: the same nodes, equal
  constants or equal literals; the range a dequantize states changes nothing it computes). Folding a pair gives up only what quantizing loses -- rounding to the
  step, saturation outside the range -- which is the point of running the chain in float. A
  dequantize with other parameters also rescales or shifts the value (a dequantize of scale
  0.25 of codes quantized with 0.5 halves it), which the stock pass drops too; PT2E writes
  both from one observer, so its pairs always agree.

The stock pass ends with FX dead-code elimination and an ``ExportPass`` retrace; the
rule rewrites in place (the adapter's ``RulePass`` runs the dead-code elimination).
"""

from __future__ import annotations

import functools
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
from ._fold_qdq_site import quantized_pair

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
    from fusionkit.targets import resolve_op

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
    """``q`` is a quantize of a graph value with the dequantize's dtype and shape, whose
    parameters the dequantize reads."""
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
    return _reads_the_quantize_parameters(ctx, q)


def _parameters(node: Node) -> dict[str, Any]:
    """The quantization parameters a quantize writes or a dequantize reads, by schema name
    (the value argument and a dequantize's float output dtype left out; torchao's code dtype
    named ``dtype`` on both sides)."""
    schema = node.target._schema  # type: ignore[union-attr]
    dequantize = op_key(node.target) in DQ_OPS
    out: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments[1:], start=1):
        if i < len(node.args):
            v = node.args[i]
        elif a.name in node.kwargs:
            v = node.kwargs[a.name]
        else:
            v = a.default_value if a.has_default_value() else None
        name = a.name
        if dequantize and name in ("out_dtype", "output_dtype"):
            continue  # the float the codes become, not how they were made
        if name in ("quant_min", "quant_max"):
            continue  # a dequantize computes (code - zero_point) * scale whatever range it states
        if name in ("input_dtype", "output_dtype"):  # torchao: the codes' dtype
            name = "dtype"
        out[name] = v
    return out


def kind_of(key: str | None) -> str:
    """``per_tensor.default`` for ``quantized_decomposed.(de)quantize_per_tensor.default``."""
    _, name, overload = (key or "..").split(".")
    return f"{name.removeprefix('de').removeprefix('quantize')}.{overload}"


def _same_parameter(ctx: CheckContext, a: Any, b: Any) -> bool:
    if isinstance(a, Node) or isinstance(b, Node):
        if a is b:
            return True
        ca = ctx.inputs.constant(a) if isinstance(a, Node) else None
        cb = ctx.inputs.constant(b) if isinstance(b, Node) else None
        return ca is not None and cb is not None and ca.tensor.dtype == cb.tensor.dtype and \
            ca.tensor.shape == cb.tensor.shape and bool(torch.equal(ca.tensor, cb.tensor))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_parameter(ctx, x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _short(v: Any) -> str:
    return f"`{v.name}`" if isinstance(v, Node) else repr(v)


def _reads_the_quantize_parameters(ctx: CheckContext, q: Node) -> str | MatchResult | None:
    dq = ctx.root
    if kind_of(op_key(q.target)) != kind_of(op_key(dq.target)):
        return ctx.fail(f"`{dq.name}` ({op_key(dq.target)}) does not undo `{q.name}` "
                        f"({op_key(q.target)}): another kind of quantization", at="q")
    wrote, reads = _parameters(q), _parameters(dq)
    for name, v in wrote.items():
        if name in reads and not _same_parameter(ctx, v, reads[name]):
            return ctx.fail(f"`{dq.name}` reads the codes with {name} {_short(reads[name])}, "
                            f"`{q.name}` wrote them with {_short(v)}: dropping the pair would "
                            "change the value, not only its rounding", at="q")
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
             constraints=[constraint("folds_a_quantize", hints=functools.partial(quantized_pair, Q_OPS, kind_of))(_folds_a_quantize)],
             replacement=PythonReplacement(_quantized_value),
             description="a dequantize of a quantize reads the quantized value in float"),
    ]


__all__ = ["DQ_OPS", "Q_OPS", "STOCK_PASS", "fold_qdq_rules", "kind_of"]
