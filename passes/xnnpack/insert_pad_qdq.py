"""A zero ``constant_pad_nd`` of a dequantized tensor -> the pad, then an implicit Q/DQ pair.

Takes over ``InsertPadQDQPass`` (``_passes/insert_pad_qdq.py``, ExecuTorch 1.5.1): a pad
between a per-tensor dequantize and a quantized op is serialized as XNNPACK's quantized
static pad only if its output is re-quantized; the pass adds that quantize/dequantize
pair, with the input's parameters (a zero pad keeps every value in range).

Constraints, as the stock pass checks them: the pad's input is a
``dequantize_per_tensor.default``; the pad value is 0 and every pad amount is >= 0; no
user of the pad is a quantize already (so running it twice adds nothing).
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
from fusionkit.passes.registry import OperandHint, register_rules

from ._common import DQ_PER_TENSOR, Q_PER_TENSOR, constraint, keep_provenance

PAD = "aten.constant_pad_nd.default"


def _quantized_zero_pad(ctx: CheckContext, input: Any, pad: Any, value: Any, pad_node: Node
                        ) -> str | MatchResult | None:
    from executorch.backends.xnnpack.utils.quant_utils import is_quant

    if not (isinstance(input, Node) and input.op == "call_function"
            and op_key(input.target) == DQ_PER_TENSOR):
        return "the pad's input is not dequantized per tensor: nothing to re-quantize"
    # the pad value and amounts are literals of the pad: its faults, as is a quantizing user
    if value != 0.0:
        return ctx.fail(f"pad value {value!r} is not 0 (the quantized pad pads with the zero "
                        "point)", at=pad_node)
    if any(p < 0 for p in pad):
        return ctx.fail(f"pad amounts {pad!r} crop (negative): not a static pad", at=pad_node)
    if any(is_quant(u) for u in pad_node.users):
        return ctx.fail("a user of the pad quantizes it already", at=pad_node)
    return None


def _pad_qdq(rw: Rewriter, pad_node: Node, input: Node) -> Node:
    from executorch.backends.xnnpack.utils.quant_utils import tag_as_implicit_q_dq

    params = tuple(input.args[1:])
    pad = rw.call(pad_node.target, *pad_node.args, **pad_node.kwargs)
    keep_provenance(pad, pad_node)
    q = rw.call(Q_PER_TENSOR, pad, *params)
    dq = rw.call(DQ_PER_TENSOR, q, *params)
    for n in (q, dq):  # the stock pass copies the pad's metadata onto both
        keep_provenance(n, pad_node)
        tag_as_implicit_q_dq(n)
    return dq


@register_rules("xnnpack", takes_over="InsertPadQDQPass")
def insert_pad_qdq_rule() -> Rule:
    return Rule(
        name="xnnpack_pad_qdq",
        pattern=op(PAD, capture("input"), capture("pad"), capture("value")).bind("pad_node"),
        constraints=[constraint("quantized_zero_pad", hints={"input": OperandHint(producer="dequantize_per_tensor"), "value": OperandHint(values=(0.0,))})(_quantized_zero_pad)],
        replacement=PythonReplacement(_pad_qdq),
        description="zero pad of a dequantized tensor, re-quantized with its parameters",
    )
