"""Port of ExecuTorch 1.5.1 ``patterns/quantized_binary.py`` (registry: ``quantized_binary``).

``quantize(add(dequantize(a), dequantize(b), alpha))`` ->
``et_vk.q8ta_add(a, b, a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, alpha)``.

Constraints stated: both operands and the output are per-tensor int8 Q/DQ with
literal scales and zero points (the op's schema takes ``float``/``int``), int8
tensors; ``alpha`` is read by schema name (the stock detector reads only
``args[2]``, so an ``alpha=`` keyword was silently dropped) and the operands
keep their order (``a + alpha*b`` is not commutative). Declined with a reason:
a relu between the add and the quantize — the stock detector accepts it, but
``q8ta_add`` has no activation argument and the relu was silently dropped.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from fusionkit import CheckContext, DtypeIn, Rule, capture, op, ref, replace_with, scalar
from fusionkit.passes.registry import register_rules

from ._common import constraint, et_vk, int8_dq, int8_q


def _qbinary_no_relu(ctx: CheckContext, relu: Node | None = None) -> str | None:
    if relu is not None:
        return ("a relu sits between the add and the quantize, but et_vk.q8ta_add has no "
                "activation argument: fusing would drop the relu")
    return None


@register_rules("builtin", "vulkan", takes_over="quantized_binary")
def quantized_binary_rule(name: str = "quantized_binary") -> Rule:
    add = op("aten.add.Tensor", int8_dq(capture("a"), "a"), int8_dq(capture("b"), "b"),
             alpha=scalar("alpha", tensor_ok=False), commutative=False).bind("add")
    relu = op("aten.relu.default", add).bind("relu")

    no_relu = constraint("no_activation")(_qbinary_no_relu)

    return Rule(
        name=name,
        pattern=int8_q(add | relu, "out"),
        constraints=[no_relu, DtypeIn("a", frozenset({torch.int8})),
                     DtypeIn("b", frozenset({torch.int8}))],
        replacement=replace_with(et_vk("q8ta_add"), ref("a"), ref("b"), ref("a_scale"),
                                 ref("a_zp"), ref("b_scale"), ref("b_zp"), ref("out_scale"),
                                 ref("out_zp"), ref("alpha")),
        description="int8 dequantize x2 -> add -> quantize into et_vk.q8ta_add",
    )
