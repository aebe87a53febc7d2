"""A generated zoo of convolution + batch norm models for the quantize step's fold.

Each model is a convolution (1-D, 2-D or transposed 2-D; with or without a bias) and a
batch norm, the fold's operands in one of these forms:

* ``param``: every operand a parameter or buffer (the plain case, which must fold as stock
  folds it);
* ``bn_weight_input`` / ``mean_input``: the batch norm's weight / running mean a graph input;
* ``bn_weight_computed`` / ``conv_weight_computed``: the batch norm's weight / the
  convolution's weight computed in the graph (``w * 2``);
* ``shared``: two convolutions sharing one weight, each with its own batch norm;
* ``conv_read_twice``: the convolution's output read beside the batch norm.

The statistics and affine parts are drawn away from the identity (seeded), so a fold that
drops or misapplies one shows.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ADVERSARIAL", "KINDS", "MODES", "ZooModel", "quantized_for_xnnpack", "zoo"]

KINDS = ("conv1d", "conv2d", "conv_transpose2d")
MODES = ("param", "bn_weight_input", "mean_input", "bn_weight_computed",
         "conv_weight_computed", "shared", "conv_read_twice")
#: the modes whose operands stock's fold does not check
ADVERSARIAL = frozenset(MODES) - {"param"}
_C_IN, _C_OUT = 3, 4


def _conv(kind: str, bias: bool) -> nn.Module:
    if kind == "conv1d":
        return nn.Conv1d(_C_IN, _C_OUT, 3, bias=bias)
    if kind == "conv2d":
        return nn.Conv2d(_C_IN, _C_OUT, 3, bias=bias)
    return nn.ConvTranspose2d(_C_IN, _C_OUT, 3, stride=2, bias=bias)


def _bn(kind: str) -> nn.Module:
    bn = nn.BatchNorm1d(_C_OUT) if kind == "conv1d" else nn.BatchNorm2d(_C_OUT)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def _functional(kind: str) -> Callable[..., torch.Tensor]:
    return {"conv1d": F.conv1d, "conv2d": F.conv2d,
            "conv_transpose2d": lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2)}[kind]


class ZooNet(nn.Module):
    def __init__(self, kind: str, bias: bool, mode: str) -> None:
        super().__init__()
        self.kind, self.mode = kind, mode
        self.conv, self.bn = _conv(kind, bias), _bn(kind)
        if mode == "shared":
            self.bn2 = _bn(kind)

    def _bn_call(self, y: torch.Tensor, bn: Any, weight: torch.Tensor | None = None,
                 mean: torch.Tensor | None = None) -> torch.Tensor:
        return F.batch_norm(y, bn.running_mean if mean is None else mean, bn.running_var,
                            bn.weight if weight is None else weight, bn.bias, False, 0.1,
                            bn.eps)

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> Any:
        conv = _functional(self.kind)
        w, b = self.conv.weight, self.conv.bias
        if self.mode == "param":
            return self.bn(self.conv(x))
        if self.mode == "bn_weight_input":
            return self._bn_call(conv(x, w, b), self.bn, weight=extra[0])
        if self.mode == "mean_input":
            return self._bn_call(conv(x, w, b), self.bn, mean=extra[0])
        if self.mode == "bn_weight_computed":
            return self._bn_call(conv(x, w, b), self.bn, weight=self.bn.weight * 2)
        if self.mode == "conv_weight_computed":
            return self.bn(conv(x, w * 2, b))
        if self.mode == "shared":
            return self.bn(conv(x, w, b)), self.bn2(conv(x * 0.5, w, b))
        y = conv(x, w, b)  # conv_read_twice
        return self.bn(y), y


@dataclass(frozen=True)
class ZooModel:
    name: str
    kind: str
    bias: bool
    mode: str

    @property
    def adversarial(self) -> bool:
        return self.mode in ADVERSARIAL

    def build(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(zlib.crc32(self.name.encode()))
        model = ZooNet(self.kind, self.bias, self.mode).eval()
        shape = (1, _C_IN, 8) if self.kind == "conv1d" else (1, _C_IN, 6, 6)
        inputs: tuple[torch.Tensor, ...] = (torch.randn(shape),)
        if self.mode == "bn_weight_input":
            inputs += (torch.rand(_C_OUT) + 0.5,)
        elif self.mode == "mean_input":
            inputs += (torch.rand(_C_OUT) - 0.5,)
        return model, inputs


def zoo() -> list[ZooModel]:
    """Every mode with every kind, the bias alternating (21 models)."""
    out = []
    for i, mode in enumerate(MODES):
        for j, kind in enumerate(KINDS):
            bias = (i + j) % 2 == 0
            out.append(ZooModel(f"{mode}-{kind}-{'bias' if bias else 'nobias'}", kind, bias,
                                mode))
    return out


def quantized_for_xnnpack(name: str) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...],
                                              list[float]]:
    """Zoo model ``name`` quantized with XNNPACK's quantizer (per channel) under fusionkit's
    XNNPACK adapter (its quantize step declines the folds stock torchao crashes on or gets
    wrong): the converted model, its inputs, and the scale of each activation dequantize, in
    graph order (the last one is the output's quantization step)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from fusionkit.backends import xnnpack_adapter

    (zm,) = [z for z in zoo() if z.name == name]
    model, inputs = zm.build()
    with xnnpack_adapter.install():
        gm = torch.export.export(model, inputs).module(check_guards=False)
        quantizer = XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(gm, quantizer)  # type: ignore[arg-type]
        prepared(*inputs)
        converted = convert_pt2e(prepared)
    scales = [float(n.args[1]) for n in converted.graph.nodes if n.op == "call_function"
              and n.target == torch.ops.quantized_decomposed.dequantize_per_tensor.default]
    return converted, inputs, scales
