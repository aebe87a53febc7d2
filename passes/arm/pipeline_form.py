"""The Arm pipeline's program form for ``fusionkit.verify``, and what its quantized nodes compute.

The DyT folds run inside ExecuTorch's TOSA pipeline, after ``FoldAndAnnotateQParamsPass``
and ``InsertRescaleInt32Pass`` and before ``InsertTableOpsPass`` / ``RewriteConvPass``. There
the program's targets are the edge dialect's op objects (``exir_ops.edge.aten.*``,
``exir_ops.backend.tosa.*``: stock's checks compare ``node.target`` with them), and the
quantized nodes carry ``input_qparams`` / ``output_qparams`` (``QuantArgs``) that say what
they compute on int8 codes. :func:`edge_dialect` gives an exported program the first;
each rule module's form derives the second from the drawn site (its rescales' scales and
zero points), as those passes would have written them.

Two nodes mean more than their op at that position, and :data:`PIPELINE_NODE_SEMANTICS`
states it (the DyT folds' program forms carry it):

* a table op (``aten.tanh``) on int8 codes with int8 qparams is what ``InsertTableOpsPass``
  makes of it: ``quantize(tanh(dequantize(codes, in)), out)`` on the codes clamped to the
  input's range (``tests/test_tosa_semantics.py`` compares it with the table the pass builds,
  on all 256 codes);
* a convolution with int8 input qparams is what ``RewriteConvPass`` makes of it: TOSA
  ``CONV2D``'s int32 accumulation of ``(x - x_zp) * (w - w_zp)`` plus the int32 bias
  (padding contributes nothing), then the output ``RESCALE`` by ``in_scale * w_scale /
  out_scale`` per output channel to the output's zero point (``insert_output_rescale``;
  compared with the TOSA reference model's ``CONV2D`` and ``RESCALE``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit.targets import op_key

from .tosa_semantics import rescale_reference

#: the namespaces whose ops the pipeline holds as edge-dialect objects (``exir_ops``)
_DIALECTS = {"aten": "edge", "tosa": "backend"}


def edge_op(target: Any) -> Any:
    """``target`` (an ``OpOverload``) as the edge dialect's op object, else ``target``."""
    from executorch.exir.dialects._ops import ops as exir_ops

    key = op_key(target)
    if key is None or not isinstance(target, torch._ops.OpOverload):
        return target
    ns, name, overload = key.split(".", 2)
    if ns not in _DIALECTS:
        return target
    return getattr(getattr(getattr(getattr(exir_ops, _DIALECTS[ns]), ns), name), overload)


def edge_dialect(ep: Any) -> None:
    """Every ATen and TOSA call of ``ep`` targets the edge dialect's op object, in place."""
    for n in ep.graph.nodes:
        if n.op == "call_function":
            n.target = edge_op(n.target)


def quant_args(scale: float | list[float], zp: int | list[int], dtype: torch.dtype, *,
               per_channel: bool = False, symmetric: bool = False) -> Any:
    """``QuantArgs`` over ``dtype``'s range, as ``FoldAndAnnotateQParamsPass`` (int8) and
    ``InsertRescaleInt32Pass`` (int32, zero point 0) write them; ``symmetric``: without the
    lowest code, as the Arm quantizer's weights and biases (``-127..127``)."""
    from executorch.backends.arm._passes.quant_args import QuantArgs

    info = torch.iinfo(dtype)
    return QuantArgs(scale=scale, zp=zp, qmin=info.min + int(symmetric), qmax=info.max,
                     dtype=dtype, axis=0, per_channel=per_channel)


def rescale_args(node: Node) -> tuple[float, int, int]:
    """A single-scale RESCALE's (scale, input zero point, output zero point)."""
    scales: Any = node.args[2]
    (scale,) = scales
    return float(scale), int(node.args[3]), int(node.args[4])  # type: ignore[arg-type]


def _qparams(node: Node, key: str) -> dict[int, Any]:
    """The node's Arm qparams under ``key`` (``QuantArgs`` by index; another backend's
    metadata under the same key is none of them)."""
    from executorch.backends.arm._passes.quant_args import QuantArgs

    got = node.meta.get(key)
    if not isinstance(got, dict) or not all(isinstance(q, QuantArgs) for q in got.values()):
        return {}
    return got


def _single(node: Node, key: str) -> Any:
    qparams = _qparams(node, key)
    return qparams.get(0) if len(qparams) == 1 else None


def table_op_semantics(node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A table op on int8 codes with single int8 qparams: what ``InsertTableOpsPass``'s
    table gives each code (``generate_8bit_table_values``); else ``NotImplemented``."""
    from executorch.backends.arm._passes.insert_table_ops import TableOps

    x = args[0] if args else None
    fn = TableOps.unary_table_ops.get(node.target)  # type: ignore[call-overload]
    q_in, q_out = _single(node, "input_qparams"), _single(node, "output_qparams")
    if (fn is None or not isinstance(x, torch.Tensor) or x.dtype != torch.int8 or q_in is None
            or q_out is None or q_in.dtype != torch.int8 or q_out.dtype != torch.int8):
        return NotImplemented
    codes = x.clamp(q_in.qmin, q_in.qmax)
    return q_out.quantize_value(fn(q_in.dequantize_value(codes))).to(torch.int8)


def quantized_conv_semantics(node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A 2-D convolution of int8 codes with int8 input qparams: TOSA ``CONV2D``'s int32
    accumulation then the output ``RESCALE`` ``RewriteConvPass`` inserts; else
    ``NotImplemented``."""
    x, w, b, stride, padding, dilation, transposed, _, groups = (*args, *[None] * 9)[:9]
    qparams = _qparams(node, "input_qparams")
    q_x, q_w, q_out = qparams.get(0), qparams.get(1), _single(node, "output_qparams")
    if (not isinstance(x, torch.Tensor) or x.dtype != torch.int8 or x.dim() != 4 or transposed
            or q_x is None or q_w is None or q_out is None or q_x.dtype != torch.int8):
        return NotImplemented
    acc = conv2d_accumulation(x, w, b, q_x.get_zp_per_tensor(), _weight_zp(q_w, w.shape[0]),
                              stride, padding, dilation, groups)
    w_scales = q_w.get_scale_per_channel() if q_w.per_channel else [q_w.get_scale_per_tensor()]
    scales = [q_x.get_scale_per_tensor() * s / q_out.get_scale_per_tensor() for s in w_scales]
    nhwc = rescale_reference(acc.permute(0, 2, 3, 1), q_out.dtype, scales, 0,
                             q_out.get_zp_per_tensor())
    return nhwc.permute(0, 3, 1, 2).contiguous()


def _weight_zp(q_w: Any, out_channels: int) -> torch.Tensor:
    zps = q_w.get_zp_per_channel() if q_w.per_channel else [q_w.get_zp_per_tensor()] * out_channels
    return torch.tensor(zps, dtype=torch.int64).reshape(-1, 1, 1, 1)


def conv2d_accumulation(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, x_zp: int,
                        w_zp: torch.Tensor | int, stride: Any, padding: Any, dilation: Any,
                        groups: Any) -> torch.Tensor:
    """TOSA ``CONV2D`` on int8: ``sum((x - x_zp) * (w - w_zp)) + bias`` in int32, a padded
    position adding nothing (exact: float64 holds every such sum of int8 products)."""
    centered_x = (x.to(torch.int64) - x_zp).double()
    centered_w = (w.to(torch.int64) - w_zp).double()
    bias = None if b is None else b.double()
    acc = torch.nn.functional.conv2d(centered_x, centered_w, bias, list(stride), list(padding),
                                     list(dilation), int(groups))
    acc = acc.round().to(torch.int64)
    if bool(((acc < -(1 << 31)) | (acc >= 1 << 31)).any()):
        raise ValueError("CONV2D: the int32 accumulator overflows (TOSA REQUIRE)")
    return acc.to(torch.int32)


#: what a node means at the TOSA pipeline's position: carried by the program forms of the
#: rules that run there (the DyT folds'), never by another rule (an XNNPACK or Vulkan
#: convolution is torch's)
PIPELINE_NODE_SEMANTICS = {"aten.tanh.default": table_op_semantics,
                           "aten.convolution.default": quantized_conv_semantics}

__all__ = ["PIPELINE_NODE_SEMANTICS", "conv2d_accumulation", "edge_dialect", "edge_op", "quant_args", "quantized_conv_semantics",
           "rescale_args", "table_op_semantics"]
