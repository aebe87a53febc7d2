"""What the XNNPACK rules share: the op names and metadata ExecuTorch 1.5.1's serializer reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

from fusionkit import Custom

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


def keep_provenance(new: Node, old: Node) -> None:
    """``new`` takes ``old``'s metadata (debug handle, stack trace, ...) but its own value.

    A stock pass that rewrites a node in place keeps that node's metadata, and only
    that; the serializer writes its debug handle into the payload. So keys the rewriter
    gave ``new`` from the match's root that ``old`` lacks go too: an op a stock pass
    created bare (no debug handle) stays without one when an activation is fused into it.
    """
    own = ("val", "tensor_meta", "fusionkit_rule")  # its value, and which rule made it
    for key in [k for k in new.meta if k not in own and k not in old.meta]:
        del new.meta[key]
    for key, value in old.meta.items():
        if key not in own:
            new.meta[key] = value
