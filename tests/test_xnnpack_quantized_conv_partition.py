"""A float convolution next to quantized tensors stays off XNNPACK (``mixed_conv_partition``).

The generated conv + batch-norm zoo (``tests/conv_batch_norm_zoo.py``) quantized with
XNNPACK's quantizer under ``xnnpack_adapter.install()`` (PTQ: ``prepare_pt2e``; QAT:
``prepare_qat_pt2e``, the config's ``is_qat``), converted, lowered with the XNNPACK
partitioner, run by ExecuTorch's runtime:

* ``shared-conv1d-nobias`` (two conv1d sharing one weight, each with its batch norm): the
  second convolution reads the float weight and a dequantized input; XNNPACK's 1-D
  convolution pass re-quantizes its input -- stock's lowering raises ``Weight and Input
  should both be quantized``;
* ``conv_weight_computed-conv1d-bias`` (the weight ``w * 2``): the batch norm after the
  quantized convolution becomes a float 1-D depthwise convolution whose output that pass
  quantizes -- stock's program is refused at load (``Failed to create depthwise
  convolution node ... xnn_status_invalid_parameter``);
* two conv2d sharing a weight and a bias, no batch norm (not in the zoo): the float second
  convolution gets the quantized first one's int32 bias -- stock's program is refused at
  load (``Failed to create convolution node ... xnn_status_invalid_parameter``).

fusionkit's partitioner keeps those nodes on the CPU, with the reason in the partitioner's
log: the ``.pte`` loads, runs and computes the converted (fake-quantized) model within two
output quantization steps (measured: exactly, 0.0). Stock's partitioner on the same
converted program still fails as described. A partitioner that takes no quantize /
dequantize (FP32 only) refuses nothing. Default run: one PTQ and one QAT model; the rest
with ``-m pipeline_full``.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conv_batch_norm_zoo import zoo
from torch import nn

from fusionkit.backends import xnnpack_adapter

pytest.importorskip("executorch.extension.pybindings.portable_lib")

_LOGGERS = ("executorch.backends.xnnpack.partition.config.gemm_configs",
            "executorch.backends.xnnpack.partition.config.node_configs")
#: model -> (what stock does with it, what fusionkit's log says stays on the CPU)
LOWERING = "Weight and Input should both be quantized"
AT_LOAD = "Failed to execute method forward"
EXPECTED = {
    "shared-conv1d-nobias": (LOWERING, ("dequantized input", "batch norm")),
    "conv_weight_computed-conv1d-bias": (AT_LOAD, ("batch norm",)),
    "shared_bias-conv2d-bias": (AT_LOAD, ("shares its bias",)),
}
DEFAULT = {("shared-conv1d-nobias", "ptq"), ("conv_weight_computed-conv1d-bias", "qat")}
CASES = [pytest.param(name, how, id=f"{name}-{how}",
                      marks=() if (name, how) in DEFAULT else pytest.mark.pipeline_full)
         for name in EXPECTED for how in ("ptq", "qat")]


class SharedBias(nn.Module):
    """Two conv2d sharing a weight and a bias (XNNPACK's quantizer quantizes the weight for
    the first one only)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, b = self.conv.weight, self.conv.bias
        return F.conv2d(x, w, b), F.conv2d(x * 0.5, w, b)


def _model(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if name == "shared_bias-conv2d-bias":
        torch.manual_seed(0)
        return SharedBias().eval(), (torch.randn(1, 3, 6, 6),)
    (z,) = [z for z in zoo() if z.name == name]
    return z.build()


@functools.cache
def _converted(name: str, how: str) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """``name`` quantized with XNNPACK's quantizer (per tensor) under fusionkit's adapter."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import (
        convert_pt2e,
        prepare_pt2e,
        prepare_qat_pt2e,
    )

    model, inputs = _model(name)
    qat = how == "qat"
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=qat))
    with xnnpack_adapter.install(), torch.no_grad():
        if qat:
            gm = torch.export.export(copy.deepcopy(model).train(), inputs).module(
                check_guards=False)
            prepared = prepare_qat_pt2e(gm, quantizer)  # type: ignore[arg-type]
            for _ in range(3):
                prepared(*inputs)
            move_exported_model_to_eval(prepared)
        else:
            gm = torch.export.export(model, inputs).module(check_guards=False)
            prepared = prepare_pt2e(gm, quantizer)  # type: ignore[arg-type]
            prepared(*inputs)
        return convert_pt2e(prepared), inputs


def _leaves(out: Any) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)


def _lower(converted: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...],
           partitioner: Any) -> Any:
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(torch.export.export(converted, inputs),
                                       partitioner=[partitioner])


def _run(lowered: Any, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    import executorch.kernels.quantized  # noqa: F401  (the portable q/dq kernels)
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    pte = lowered.to_executorch().buffer  # held while it runs: the runtime does not copy it
    module = _load_for_executorch_from_buffer(pte)
    out = list(module.forward(inputs))
    del module
    return out


def _stock() -> Any:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def _reasons(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records
            if r.name in _LOGGERS and "kept on the CPU by fusionkit" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "how"), CASES)
def test_fusionkit_keeps_the_mixed_convolution_on_the_cpu(
        name: str, how: str, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    stock_failure, kept = EXPECTED[name]
    converted, inputs = _converted(name, how)
    with torch.no_grad():
        want = _leaves(converted(*inputs))
    steps = 2 * max(float(t.abs().max()) for t in want) / 127

    # fusionkit's partitioner: lowers, the .pte loads and runs, the converted model's values
    for level_logger in _LOGGERS:
        caplog.set_level(logging.DEBUG, logger=level_logger)
    lowered = _lower(converted, inputs, xnnpack_adapter.XnnpackPartitioner())
    reasons = _reasons(caplog.records)
    delegates = [n for n in lowered.exported_program().graph.nodes
                 if n.op == "call_function" and "call_delegate" in str(n.target)]
    got = _run(lowered, inputs)
    error = max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))
    assert error <= steps, (error, steps)
    assert delegates, "nothing delegated: the condition must keep only the mixed nodes"
    for what in kept:
        assert any(what in r for r in reasons), (what, reasons)

    # stock's partitioner on the same converted program: the failure fusionkit avoids
    assert not xnnpack_adapter.is_installed()
    capfd.readouterr()
    with pytest.raises(RuntimeError, match=stock_failure):
        _run(_lower(converted, inputs, _stock()), inputs)
    if stock_failure == AT_LOAD:
        assert "xnn_status_invalid_parameter" in capfd.readouterr().err


def test_an_fp32_only_partitioner_takes_the_float_convolutions(
        caplog: pytest.LogCaptureFixture) -> None:
    """A partitioner that takes no quantize / dequantize (``config_precisions=FP32``) never
    puts a quantized tensor next to a float convolution: nothing is refused, the float
    convolution and batch norms are delegated, the program runs."""
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType

    converted, inputs = _converted("shared-conv1d-nobias", "ptq")
    with torch.no_grad():
        want = _leaves(converted(*inputs))
    for level_logger in _LOGGERS:
        caplog.set_level(logging.DEBUG, logger=level_logger)
    lowered = _lower(converted, inputs, xnnpack_adapter.XnnpackPartitioner(
        config_precisions=ConfigPrecisionType.FP32))
    assert _reasons(caplog.records) == []
    delegated = [n for n in lowered.exported_program().graph.nodes
                 if n.op == "call_function" and "call_delegate" in str(n.target)]
    left = [str(n.target) for n in lowered.exported_program().graph.nodes
            if n.op == "call_function" and "convolution" in str(n.target)]
    assert delegated and len(left) == 1, left  # the quantized convolution only
    got = _run(lowered, inputs)
    steps = 2 * max(float(t.abs().max()) for t in want) / 127
    assert max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) <= steps


def test_the_condition_is_in_place_only_while_partitioning() -> None:
    from executorch.backends.xnnpack.partition.config.gemm_configs import ConvolutionConfig
    from executorch.backends.xnnpack.partition.config.node_configs import BatchNormConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from fusionkit.backends.xnnpack_adapter import mixed_conv_partition

    owners = (ConvolutionConfig, BatchNormConfig, XnnpackPartitioner)
    names = ("check_constraints", "check_constraints", "generate_partitions")
    stock = [vars(o)[n] for o, n in zip(owners, names, strict=True)]
    assert not mixed_conv_partition.PATCHES.is_installed()
    with xnnpack_adapter.install():
        assert all(vars(o)[n] is not s for o, n, s in zip(owners, names, stock, strict=True))
    assert [vars(o)[n] for o, n in zip(owners, names, strict=True)] == stock


def test_no_reason_for_a_quantized_or_a_plain_float_convolution() -> None:
    """The condition names only the mixed nodes: a quantized 1-D convolution with its batch
    norm folded, and a float 1-D convolution + batch norm, get no reason."""
    from executorch.exir import to_edge

    from fusionkit.backends.xnnpack_adapter.mixed_conv_partition import mixed_conv_reason

    converted, inputs = _converted("param-conv1d-bias", "ptq")
    model, _ = _model("param-conv1d-bias")
    for gm in (converted, model):
        ep = to_edge(torch.export.export(gm, inputs)).exported_program()
        kinds = {str(n.target) for n in ep.graph.nodes}
        assert any("convolution" in k for k in kinds), kinds
        assert [mixed_conv_reason(n) for n in ep.graph.nodes if n.op == "call_function"
                and mixed_conv_reason(n)] == []
