"""Give ``aten.native_layer_norm`` the weight and bias the Vulkan kernel requires.

``LayerNorm(elementwise_affine=False)`` (the SD3.5 MMDiT and Flux blocks, most
DiT-style AdaLN) exports ``native_layer_norm(x, shape, None, None, eps)``.
ExecuTorch 1.5.1's Vulkan op registry accepts that node, the partitioner
delegates it, and the runtime then throws while building the graph
(``NativeLayerNorm.cpp``: "native_layer_norm requires weight to be non-None",
the same for bias) -- the whole delegate fails to load, stock included.

The rule replaces a missing weight with ones and a missing bias with zeros
(lifted constants of the normalized shape and the input's dtype): ``y * 1 + 0``
is ``y`` exactly in IEEE arithmetic, so the program computes what the model
did, and the kernel gets the prepackable constants it needs. The constants
are made per layer norm, not shared: ExecuTorch 1.5.1 duplicates a lifted
constant used by several partitions (``duplicate_constant_node``) without
adding the copies to the delegate's ``constants``, and ``to_executorch`` then
fails ("... is not a buffer"); a normalized-shape vector per norm is cheap.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    DtypeIn,
    PythonReplacement,
    Rewriter,
    Rule,
    capture,
    int_list,
    lit,
    op,
)
from fusionkit.passes.registry import register_rules

from ._common import FP_T, constraint

LAYER_NORM = "aten.native_layer_norm.default"


def _static_shape(ctx: CheckContext, shape: Any) -> str | None:
    if not all(isinstance(d, int) and d > 0 for d in shape):
        return f"normalized_shape {list(shape)} is not a list of positive ints"
    return None


def _affine_name(rw: Rewriter, kind: str) -> str:
    return f"fusionkit_{rw.root.name}_{kind}"


def _build(rw: Rewriter, x: Node, shape: Any, eps: Any, weight: Any = None,
           bias: Any = None) -> Node:
    shape = tuple(int(d) for d in shape)
    # the dtype of the operand the norm has (an fp16 input may have fp32 parameters: both must
    # then be fp32, else native_layer_norm raises "mixed dtype"), else the input's
    given = weight if weight is not None else bias
    dtype = (given.meta["val"].dtype if isinstance(given, Node) else x.meta["val"].dtype)
    if weight is None:
        weight = rw.constant(_affine_name(rw, "ones"), torch.ones(shape, dtype=dtype))
    if bias is None:
        bias = rw.constant(_affine_name(rw, "zeros"), torch.zeros(shape, dtype=dtype))
    return rw.call(LAYER_NORM, x, list(shape), weight, bias, eps)


@register_rules("vulkan", roots=("aten.native_layer_norm.default",))
def layer_norm_affine_rule(name: str = "layer_norm_affine") -> Rule:
    """``native_layer_norm`` without weight or bias -> the same op with ones / zeros."""
    # a missing operand binds nothing (the capture is absent from the match); a norm with
    # both operands matches neither option and is not this rule's business (no decline)
    x, shape, eps = capture("x"), int_list(name="shape"), capture("eps")
    pattern = (op(LAYER_NORM, x, shape, lit(None), lit(None) | capture("bias"), eps)
               | op(LAYER_NORM, x, shape, capture("weight"), lit(None), eps))
    return Rule(
        name=name,
        pattern=pattern,
        constraints=[
            constraint("static_normalized_shape")(_static_shape),
            DtypeIn("x", FP_T),
        ],
        replacement=PythonReplacement(_build),
        description="a layer norm without weight/bias gets ones/zeros, which the Vulkan kernel "
        "requires (it throws on None)",
    )
