"""Port of ExecuTorch 1.5.1 ``patterns/quantized_unary.py`` (registry: ``quantized_unary``).

``quantize(relu(dequantize(xq)))`` -> ``et_vk.q8ta_relu(xq, in_scale, in_zp, out_scale, out_zp)``.

Constraints stated (the stock detector checks only the op names and that the
relu has one user): per-tensor int8 Q/DQ with literal scale and zero point
(the op's schema takes ``float``/``int``), the full int8 range, an int8 input
tensor; the relu's only user is the quantize (the no-escape rule).
"""

from __future__ import annotations

import torch

from fusionkit import DtypeIn, Rule, capture, op, ref, replace_with
from fusionkit.passes.registry import register_rules

from ._common import et_vk, int8_dq, int8_q


@register_rules("vulkan_patterns", "vulkan", takes_over="quantized_unary", roots=("quantized_decomposed.quantize_per_tensor.default",))
def quantized_unary_rule(name: str = "quantized_unary") -> Rule:
    relu = op("aten.relu.default", int8_dq(capture("xq"), "in"))
    return Rule(
        name=name,
        pattern=int8_q(relu, "out"),
        constraints=[DtypeIn("xq", frozenset({torch.int8}))],
        replacement=replace_with(et_vk("q8ta_relu"), ref("xq"), ref("in_scale"), ref("in_zp"),
                                 ref("out_scale"), ref("out_zp")),
        description="int8 dequantize -> relu -> quantize into et_vk.q8ta_relu",
    )
