"""Port of ExecuTorch 1.5.1 ``patterns/quantized_binary.py`` (registry: ``quantized_binary``).

``quantize(add(dequantize(a), dequantize(b), alpha))`` ->
``et_vk.q8ta_add(a, b, a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, alpha)``.

Constraints stated: both operands and the output are per-tensor int8 Q/DQ with
literal scales and zero points (the op's schema takes ``float``/``int``), int8
tensors; ``alpha`` is read by schema name (the stock detector reads only
``args[2]``, so an ``alpha=`` keyword was silently dropped) and the operands
keep their order (``a + alpha*b`` is not commutative). A relu between the add and
the quantize is fused only where the output quantization already clamps at zero
(``out_zp == -128``, what a pt2e observer gives a relu's output: ``dequantize(-128) ==
0``, so ``quantize(relu(y)) == quantize(y)`` for every ``y``);
otherwise declined with a reason -- the stock detector accepts it whatever the zero point,
but ``q8ta_add`` has no activation argument and the relu was silently dropped.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from fusionkit import CheckContext, DtypeIn, Rule, capture, op, ref, replace_with, scalar
from fusionkit.passes.registry import register_rules

from ._common import constraint, et_vk, int8_dq, int8_q


def _qbinary_no_relu(ctx: CheckContext, out_zp: int, relu: Node | None = None) -> str | None:
    # quantize clamps to [-128, 127]: with zero point -128 a negative y and relu(y) = 0
    # both give -128, so the relu is the quantization's own clamp
    if relu is not None and out_zp > -128:
        return (f"a relu sits between the add and the quantize, but et_vk.q8ta_add has no "
                f"activation argument and the output's zero point {out_zp} (not -128) keeps "
                f"negative values: fusing would drop the relu")
    return None


@register_rules("vulkan_patterns", "vulkan", takes_over="quantized_binary", roots=("quantized_decomposed.quantize_per_tensor.default",))
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
