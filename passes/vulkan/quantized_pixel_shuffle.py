"""Port of ExecuTorch 1.5.1 ``patterns/quantized_pixel_shuffle.py`` (``quantized_pixel_shuffle``).

``quantize(pixel_shuffle(dequantize(xq), r))`` (clones allowed in between) ->
``et_vk.q8ta_pixel_shuffle(xq, in_scale, in_zp, 1/out_scale, out_zp, r)``.

Constraints stated: per-tensor int8 Q/DQ with literal scale/zero point (the
stock replacement raised ``NotImplementedError`` mid-rewrite for a tensor
output scale; here such a graph is simply not matched), a positive output
scale (it is inverted), upscale factor 2 (the runtime aborts on any other:
``VK_CHECK_COND(r == 2)``), a rank-4 int8 input whose
channels divide by r*r; every intermediate has one user (no-escape rule).
"""

from __future__ import annotations

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    DtypeIn,
    PythonReplacement,
    Rank,
    Rewriter,
    Rule,
    capture,
    integer,
    op,
    through,
)
from fusionkit.passes.registry import OperandHint, register_rules

from ._common import CLONES, constraint, et_vk, int8_dq, int8_q, shape


def _pixel_shuffle_channels(ctx: CheckContext, xq: Node, r: int) -> str | None:
    s = shape(xq)
    if r != 2:
        return (f"upscale factor {r}: the q8ta_pixel_shuffle kernel supports 2 only (the "
                "runtime aborts: r == 2)")
    if s is not None and len(s) == 4 and isinstance(s[1], int) and s[1] % (r * r) == 0:
        return None
    return f"input of shape {s} has no channel count divisible by r*r = {r * r}"


def _pixel_shuffle_build(rw: Rewriter, xq: Node, in_scale: float, in_zp: int,
                         out_scale: float, out_zp: int, r: int) -> Node:
    return rw.call(et_vk("q8ta_pixel_shuffle"), xq, in_scale, in_zp, 1.0 / float(out_scale),
                   out_zp, r)


@register_rules("vulkan_patterns", "vulkan", takes_over="quantized_pixel_shuffle",
                roots=("quantized_decomposed.quantize_per_tensor.default",))
def quantized_pixel_shuffle_rule(name: str = "quantized_pixel_shuffle") -> Rule:
    factor = integer("r", lo=1)  # the upscale factor
    shuffle = op("aten.pixel_shuffle.default", through(CLONES, int8_dq(capture("xq"), "in")),
                 factor)

    channels = constraint("channels_divisible", hints={"xq": OperandHint(shapes=((1, 4, 2, 3), (2, 8, 3, 5), (1, 9, 2, 3)))})(_pixel_shuffle_channels)
    build = _pixel_shuffle_build

    return Rule(
        name=name,
        pattern=int8_q(through(CLONES, shuffle), "out"),
        constraints=[DtypeIn("xq", frozenset({torch.int8})), Rank("xq", frozenset({4})),
                     channels],
        replacement=PythonReplacement(build),
        description="int8 dequantize -> pixel_shuffle -> quantize into et_vk.q8ta_pixel_shuffle",
    )
