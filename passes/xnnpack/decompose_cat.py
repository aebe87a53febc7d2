"""A concatenation of more than 5 tensors -> a chain of concatenations of at most 5.

Takes over ``DecomposeConcatenate`` (``_passes/decompose_cat.py``, ExecuTorch 1.5.1):
XNNPACK's concatenate takes 2 to 5 inputs, so ``cat([t0 .. tn], d)`` becomes
``c1 = cat([t0 .. t4], d)``, ``c2 = cat([c1, t5 .. t8], d)``, ... In a quantized
graph (every input dequantized, every user a quantize) each intermediate result is
re-quantized with the inputs' parameters (an implicit Q/DQ pair), as the stock pass does.

Constraints: more than 5 tensors; in the quantized form, every input is dequantized
per tensor with the *same* parameters (the stock pass takes the first input's and
never looks at the others: different ones would clip and shift the intermediate
results; the quantizer normally shares them, so this is a safety net).
"""

from __future__ import annotations

from typing import Any

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

from ._common import DQ_PER_TENSOR, Q_PER_TENSOR, constraint, keep_provenance

CAT = "aten.cat.default"
#: the most inputs XNNPACK's concatenate takes (``DecomposeConcatenate``'s 5)
MAX_INPUTS = 5


def _is_quantized(cat: Node) -> bool:
    """The stock pass's test: every input a dequantize, every user a quantize."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    tensors = cat.args[0]
    assert isinstance(tensors, (list, tuple))
    return (all(isinstance(t, Node) and is_dequant(t) for t in tensors)
            and all(is_quant(u) for u in cat.users))


def _qparams(dq: Node) -> tuple[Any, ...]:
    return tuple(dq.args[1:])


def _too_many_inputs(ctx: CheckContext, tensors: Any) -> str | None:
    if not isinstance(tensors, (list, tuple)) or len(tensors) <= MAX_INPUTS:
        n = len(tensors) if isinstance(tensors, (list, tuple)) else tensors
        return f"{n} tensors: XNNPACK concatenates up to {MAX_INPUTS} at once"
    return None


def _shared_quantization(ctx: CheckContext, tensors: Any, cat: Node) -> str | MatchResult | None:
    if not _is_quantized(cat):
        return None
    inputs: list[Node] = list(tensors)
    first = inputs[0]
    # blamed on the input at fault (an element of the captured list, so a node of its own)
    if op_key(first.target) != DQ_PER_TENSOR:
        return ctx.fail(f"input `{first.name}` is dequantized by {first.target}, not per "
                        "tensor: the intermediate results cannot be re-quantized like it",
                        at=first)
    for t in inputs[1:]:
        if _qparams(t) != _qparams(first) or t.target != first.target:
            return ctx.fail(f"input `{t.name}` is quantized with {_qparams(t)}, input "
                            f"`{first.name}` with {_qparams(first)}: the intermediate results "
                            "would be re-quantized with only one of them", at=t)
    return None


def _decomposed(rw: Rewriter, cat: Node) -> Node:
    from executorch.backends.xnnpack.utils.quant_utils import tag_as_implicit_q_dq

    rest = tuple(cat.args[1:])
    # the live list (an input replaced by another match this round is its replacement)
    tensors: list[Any] = list(cat.args[0])  # type: ignore[arg-type]
    quantized = _is_quantized(cat)
    first = tensors[0]
    # as the stock pass: the first 5, then the previous result and up to 4 more each time
    node = rw.call(CAT, tensors[:MAX_INPUTS], *rest, **cat.kwargs)
    keep_provenance(node, cat)  # the stock pass keeps this node: its metadata with it
    created = len(rw.created)
    tensors = tensors[MAX_INPUTS:]
    while tensors:
        prev = node
        if quantized:
            q_kwargs = {k: v for k, v in first.kwargs.items() if k != "out_dtype"}
            q = rw.call(Q_PER_TENSOR, node, *_qparams(first), **q_kwargs)
            tag_as_implicit_q_dq(q)
            prev = rw.call(DQ_PER_TENSOR, q, *_qparams(first), **first.kwargs)
            tag_as_implicit_q_dq(prev)
        node = rw.call(CAT, [prev, *tensors[:MAX_INPUTS - 1]], *rest, **cat.kwargs)
        tensors = tensors[MAX_INPUTS - 1:]
    for later in rw.created[created:]:
        # the stock pass keeps the cat node for the first 5 and creates the others bare:
        # only the first carries the source op's debug handle into the payload
        later.meta.pop("debug_handle", None)
    return node


@register_rules("xnnpack", takes_over="DecomposeConcatenate")
def decompose_cat_rule() -> Rule:
    return Rule(
        name="xnnpack_decompose_cat",
        pattern=op(CAT, capture("tensors"), strict_defaults=False).bind("cat"),
        constraints=[constraint("more_than_5_inputs")(_too_many_inputs),
                     constraint("shared_quantization")(_shared_quantization)],
        replacement=PythonReplacement(_decomposed),
        description="cat of more than 5 tensors into a chain of cats of at most 5",
    )
