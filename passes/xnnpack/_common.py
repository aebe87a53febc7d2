"""What the XNNPACK rules share: the op names and metadata ExecuTorch 1.5.1's serializer reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

from fusionkit import Custom
from fusionkit.passes._provenance import keep_provenance as keep_provenance  # (shared)

#: ``FuseActivationPass.FUSED_ACTIVATION_TAG``: the node meta key XNNPACK's conv, linear,
#: add, sub and mul visitors read their ``output_min``/``output_max`` from
FUSED_ACTIVATION_TAG = "XNN_FUSED_ACTIVATION"

CONV = "aten.convolution.default"
LINEAR = "aten.linear.default"
Q_PER_TENSOR = "quantized_decomposed.quantize_per_tensor.default"
DQ_PER_TENSOR = "quantized_decomposed.dequantize_per_tensor.default"


def constraint(name: str) -> Callable[[Callable[..., Any]], Custom]:
    """Decorator: a :class:`~fusionkit.Custom` check ``fn(ctx, *captures) -> reason | None``.

    The captures it reads are its parameters after ``ctx``: the signature is the only list
    of them.
    """

    def wrap(fn: Callable[..., Any]) -> Custom:
        return Custom(fn, name)

    return wrap


def rank_of(v: Any) -> int | None:
    val = v.meta.get("val") if isinstance(v, Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


