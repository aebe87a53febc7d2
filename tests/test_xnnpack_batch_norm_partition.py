"""A batch norm of a dequantized tensor stays off XNNPACK (``batch_norm_partition``).

The generated conv + batch-norm models whose convolution's output is also returned
(``conv_read_twice``), quantized with XNNPACK's quantizer under fusionkit (whose quantize
step declines the fold: the convolution's output is read twice): stock's partitioner delegates the batch norm to be decomposed into a float
depthwise convolution of the int8 tensor, which XNNPACK cannot compute -- one lowering
error, one silently wrong program, one run-time error. Under ``install()`` and with the
adapter's partitioner the batch norm stays on the CPU: every program runs within one
quantization step of the fake-quantized model; fusionkit's decomposition rule declines the
batch norm for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conv_batch_norm_zoo import quantized_for_xnnpack, zoo

from fusionkit.backends import xnnpack_adapter

pytest.importorskip("executorch.extension.pybindings.portable_lib")

CASES = [z.name for z in zoo() if z.mode == "conv_read_twice"]


def _quantized(name: str) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...], float]:
    """The converted model (fusionkit's quantize step declines the fold: the convolution's
    output is returned too; stock torchao's folds it and quantizes another model than the
    eager one), its inputs and its coarsest activation quantization step."""
    converted, inputs, scales = quantized_for_xnnpack(name)
    return converted, inputs, max(scales)


def _run(converted: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...],
         partitioner: Any) -> list[torch.Tensor]:
    import executorch.kernels.quantized  # noqa: F401  (the portable q/dq kernels)
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    lowered = to_edge_transform_and_lower(torch.export.export(converted, inputs),
                                          partitioner=[partitioner])
    pte = lowered.to_executorch().buffer  # held while it runs: the runtime does not copy it
    return list(_load_for_executorch_from_buffer(pte).forward(inputs))


def _stock() -> Any:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def _outcome(run: Callable[[], list[torch.Tensor]], want: list[torch.Tensor]) -> str | float:
    try:
        got = run()
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))


@pytest.fixture(scope="module")
def outcomes() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in CASES:
        converted, inputs, step = _quantized(name)
        with torch.no_grad():
            want = list(converted(*inputs))
        row: dict[str, Any] = {"step": step}
        def lower(partitioner: Any, gm: Any = converted, args: Any = inputs) -> Any:
            return lambda: _run(gm, args, partitioner)

        row["stock"] = _outcome(lower(_stock()), want)
        with xnnpack_adapter.install():
            row["installed"] = _outcome(lower(_stock()), want)
        row["adapter"] = _outcome(lower(xnnpack_adapter.XnnpackPartitioner()), want)
        out[name] = row
    return out


def test_stock_cannot_compute_a_batch_norm_of_a_dequantized_tensor(
        outcomes: dict[str, dict[str, Any]]) -> None:
    broken = {name: row["stock"] for name, row in outcomes.items()
              if isinstance(row["stock"], str) or row["stock"] > 20 * row["step"]}
    assert len(CASES) == 3 and broken.keys() == outcomes.keys(), outcomes


@pytest.mark.parametrize("way", ["installed", "adapter"])
def test_fusionkit_keeps_it_on_the_cpu_and_the_program_is_right(
        outcomes: dict[str, dict[str, Any]], way: str) -> None:
    for name, row in outcomes.items():
        got = row[way]
        assert isinstance(got, float) and got <= row["step"] * 1.001, (name, row)


def test_the_decomposition_rule_declines_it_with_the_reason() -> None:
    from executorch.exir import to_edge

    from fusionkit import find_matches
    from fusionkit.passes.xnnpack.decompose_batch_norm import decompose_batch_norm_rule

    converted, inputs, _ = _quantized(CASES[0])
    ep = to_edge(torch.export.export(converted, inputs)).exported_program()
    ms = find_matches(ep, [decompose_batch_norm_rule()])
    assert not ms.accepted
    reasons = [d.reason for d in ms.declined]
    assert any("dequantized" in (r or "") for r in reasons), reasons


def test_the_partition_condition_is_in_place_only_while_partitioning() -> None:
    from executorch.backends.xnnpack._passes.decompose_batch_norm import DecomposeBatchNorm

    from fusionkit.backends.xnnpack_adapter import batch_norm_partition

    stock = DecomposeBatchNorm.can_decompose_batch_norm
    assert not batch_norm_partition.PATCHES.is_installed()
    with xnnpack_adapter.install():
        assert DecomposeBatchNorm.can_decompose_batch_norm is not stock
    assert DecomposeBatchNorm.can_decompose_batch_norm is stock
