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

from collections.abc import Mapping
from typing import Any

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
from fusionkit.passes.registry import register_rules

from ._common import CLONES, constraint, et_vk, int8_dq, int8_q, shape_of


def _pixel_shuffle_channels(ctx: CheckContext) -> str | None:
    s, r = shape_of(ctx, "xq"), ctx.captures["r"]
    if r != 2:
        return (f"upscale factor {r}: the q8ta_pixel_shuffle kernel supports 2 only (the "
                "runtime aborts: r == 2)")
    if s is not None and len(s) == 4 and isinstance(s[1], int) and s[1] % (r * r) == 0:
        return None
    return f"input of shape {s} has no channel count divisible by r*r = {r * r}"


def _pixel_shuffle_build(rw: Rewriter, c: Mapping[str, Any]) -> Node:
    return rw.call(et_vk("q8ta_pixel_shuffle"), c["xq"], c["in_scale"], c["in_zp"],
                   1.0 / float(c["out_scale"]), c["out_zp"], c["r"])


@register_rules("builtin", "vulkan", takes_over="quantized_pixel_shuffle")
def quantized_pixel_shuffle_rule(name: str = "quantized_pixel_shuffle") -> Rule:
    factor = integer("r", lo=1)  # the upscale factor
    shuffle = op("aten.pixel_shuffle.default", through(CLONES, int8_dq(capture("xq"), "in")),
                 factor)

    channels = constraint("channels_divisible", "xq", "r")(_pixel_shuffle_channels)
    build = _pixel_shuffle_build

    return Rule(
        name=name,
        pattern=int8_q(through(CLONES, shuffle), "out"),
        constraints=[DtypeIn("xq", frozenset({torch.int8})), Rank("xq", frozenset({4})),
                     channels],
        replacement=PythonReplacement(build, frozenset({"xq", "in_scale", "in_zp", "out_scale",
                                                         "out_zp", "r"})),
        description="int8 dequantize -> pixel_shuffle -> quantize into et_vk.q8ta_pixel_shuffle",
    )
