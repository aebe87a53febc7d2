"""What the XNNPACK rules share: the op names and metadata ExecuTorch 1.5.1's serializer reads."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit.passes._constraint import constraint as constraint  # (shared)
from fusionkit.passes._provenance import keep_provenance as keep_provenance  # (shared)

#: ``FuseActivationPass.FUSED_ACTIVATION_TAG``: the node meta key XNNPACK's conv, linear,
#: add, sub and mul visitors read their ``output_min``/``output_max`` from
FUSED_ACTIVATION_TAG = "XNN_FUSED_ACTIVATION"

CONV = "aten.convolution.default"
LINEAR = "aten.linear.default"
Q_PER_TENSOR = "quantized_decomposed.quantize_per_tensor.default"
DQ_PER_TENSOR = "quantized_decomposed.dequantize_per_tensor.default"


def is_dequantize(n: Any) -> bool:
    """Whether ``n`` is a dequantize as XNNPACK counts one (its ``quant_utils.is_dequant``):
    XNNPACK reads the quantized tensor before it."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant

    return isinstance(n, Node) and is_dequant(n)


def rank_of(v: Any) -> int | None:
    val = v.meta.get("val") if isinstance(v, Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


