"""Fuse a ReLU or hardtanh after a convolution into ``et_vk.conv_with_clamp``.

Replaces ``FuseClampPass`` (``executorch/backends/transforms/fuse_conv_with_clamp.py``,
run by ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1) as a rule:
``relu(conv(...))`` -> ``conv_with_clamp(..., 0.0, sys.float_info.max)`` and
``hardtanh(conv(...), lo, hi)`` -> ``conv_with_clamp(..., lo, hi)`` (``-1, 1`` when the
bounds are left out), the bounds the stock pass computes.

What the stock pass checks inline, stated here: the convolution has one user (the
pattern: an intermediate is used only inside the match). What it forgets: a hardtanh
with one bound given (``args[1]`` without ``args[2]``) makes it raise ``IndexError``
inside preprocess; the pattern reads both bounds by schema name (defaults included).
The stock pass ends with a retrace; the rule rewrites in place. The fused node goes
where the convolution was, as the stock pass puts it (the serializer numbers
operators in graph order).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from torch.fx import Node

from fusionkit import PythonReplacement, Rewriter, Rule, any_value, capture, lit, op, scalar
from fusionkit.passes.registry import register_rules

from ._common import et_vk

CONV = "aten.convolution.default"
RELU = "aten.relu.default"
HARDTANH = "aten.hardtanh.default"

STOCK_PASS = "FuseClampPass"

_CONV_ARGS = ("x", "w", "b", "stride", "padding", "dilation", "transposed", "output_padding",
              "groups")


def _conv() -> Any:
    return op(CONV, capture("x"), capture("w"), lit(None) | capture("b"),
              *(any_value(n) for n in _CONV_ARGS[3:])).bind("conv")


def _build(rw: Rewriter, c: Mapping[str, Any], lo: Any, hi: Any) -> Node:
    if c["conv"].graph is rw.graph:  # (a probe builds into a scratch graph)
        rw.insert_before = c["conv"]  # where the stock pass puts the fused node
    # no bias: "b" is absent from the match (the None alternative binds nothing)
    return rw.call(et_vk("conv_with_clamp"), *(c.get(n) for n in _CONV_ARGS), lo, hi)


def _relu_clamp(rw: Rewriter, c: Mapping[str, Any]) -> Node:
    return _build(rw, c, 0.0, sys.float_info.max)


def _hardtanh_clamp(rw: Rewriter, c: Mapping[str, Any]) -> Node:
    return _build(rw, c, c.get("lo", -1.0), c.get("hi", 1.0))


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def conv_clamp_rules() -> list[Rule]:
    """relu / hardtanh after a single-user convolution -> et_vk.conv_with_clamp."""
    reads = frozenset({"conv", *_CONV_ARGS})
    return [
        Rule(
            name="conv_relu_clamp",
            pattern=op(RELU, _conv()),
            constraints=[],
            replacement=PythonReplacement(_relu_clamp, reads),
            description="relu after a convolution, fused into conv_with_clamp(0, float max)",
        ),
        Rule(
            name="conv_hardtanh_clamp",
            pattern=(op(HARDTANH, _conv(), scalar("lo", tensor_ok=False),
                        scalar("hi", tensor_ok=False))
                     | op(HARDTANH, _conv())),
            constraints=[],
            replacement=PythonReplacement(_hardtanh_clamp, reads | {"lo", "hi"}),
            description="hardtanh after a convolution, fused into conv_with_clamp(min, max)",
        ),
    ]


__all__ = ["STOCK_PASS", "conv_clamp_rules"]
