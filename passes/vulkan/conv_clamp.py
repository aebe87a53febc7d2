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
from typing import Any

import torch
from torch.fx import Node

from fusionkit import PythonReplacement, Rewriter, Rule, any_value, capture, lit, op, scalar
from fusionkit.passes.registry import OpSemantics, register_rules

from ._common import et_vk

CONV = "aten.convolution.default"
RELU = "aten.relu.default"
HARDTANH = "aten.hardtanh.default"

STOCK_PASS = "FuseClampPass"

#: the convolution's arguments after input, weight and bias
_GEOMETRY = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def conv_with_clamp_kernel(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           stride: Any, padding: Any, dilation: Any, transposed: bool,
                           output_padding: Any, groups: int, output_min: Any = None,
                           output_max: Any = None) -> torch.Tensor:
    """What the runtime's ``conv2d*_clamp`` shaders compute: the convolution, then
    ``clamp(out, out_min, out_max)`` with bounds the runtime reads as C++ ``float``
    (``Convolution.cpp``: ``extract_scalar<float>``), so ``sys.float_info.max`` becomes
    ``+inf``. ExecuTorch's CPU reference clamps with the double and raises on float32."""
    out = torch.convolution(input, weight, bias, stride, padding, dilation, transposed,
                            output_padding, groups)
    lo, hi = (None if b is None else torch.tensor(float(b), dtype=torch.float64)
              .to(torch.float32).to(out.dtype) for b in (output_min, output_max))
    return torch.clamp(out, lo, hi)


#: what the kernel computes, for fusionkit.verify
SEMANTICS = OpSemantics(kernel_references={"et_vk.conv_with_clamp.default": conv_with_clamp_kernel},
                        operands_like={"et_vk.conv_with_clamp.default": "aten.convolution.default"})


def _conv() -> Any:
    return op(CONV, capture("x"), capture("w"), lit(None) | capture("b"),
              *(any_value(n) for n in _GEOMETRY)).bind("conv")


def _build(rw: Rewriter, conv: Node, conv_args: tuple[Any, ...], lo: Any, hi: Any) -> Node:
    rw.insert_at(conv)  # where the stock pass puts the fused node
    return rw.call(et_vk("conv_with_clamp"), *conv_args, lo, hi)


def _relu_clamp(rw: Rewriter, conv: Node, x: Node, w: Node, stride: Any, padding: Any,
                dilation: Any, transposed: Any, output_padding: Any, groups: Any,
                b: Node | None = None) -> Node:
    # no bias: "b" is absent from the match (the None alternative binds nothing)
    return _build(rw, conv, (x, w, b, stride, padding, dilation, transposed, output_padding,
                             groups), 0.0, sys.float_info.max)


def _hardtanh_clamp(rw: Rewriter, conv: Node, x: Node, w: Node, stride: Any, padding: Any,
                    dilation: Any, transposed: Any, output_padding: Any, groups: Any,
                    b: Node | None = None, lo: Any = -1.0, hi: Any = 1.0) -> Node:
    # lo / hi are absent where the hardtanh leaves its bounds out: its schema defaults
    return _build(rw, conv, (x, w, b, stride, padding, dilation, transposed, output_padding,
                             groups), lo, hi)


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS, semantics=SEMANTICS)
def conv_clamp_rules() -> list[Rule]:
    """relu / hardtanh after a single-user convolution -> et_vk.conv_with_clamp."""
    return [
        Rule(
            name="conv_relu_clamp",
            pattern=op(RELU, _conv()),
            constraints=[],
            replacement=PythonReplacement(_relu_clamp),
            description="relu after a convolution, fused into conv_with_clamp(0, float max)",
        ),
        Rule(
            name="conv_hardtanh_clamp",
            pattern=(op(HARDTANH, _conv(), scalar("lo", tensor_ok=False),
                        scalar("hi", tensor_ok=False))
                     | op(HARDTANH, _conv())),
            constraints=[],
            replacement=PythonReplacement(_hardtanh_clamp),
            description="hardtanh after a convolution, fused into conv_with_clamp(min, max)",
        ),
    ]


__all__ = ["STOCK_PASS", "conv_clamp_rules", "conv_with_clamp_kernel"]
