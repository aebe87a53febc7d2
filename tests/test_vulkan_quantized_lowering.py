"""Every torchao-quantized linear that stock ExecuTorch lowers for Vulkan, the drop-in lowers.

The cases are generated over the configurations torchao offers for Vulkan:
int4 weight-only and 8da4w (int8 dynamic per-token activations, int4 weights)
with group sizes 32/64/128/256, int8 weight-only per channel; each with and
without bias, with one row and with several (batch x sequence). For each, the
drop-in (``transform_passes()`` + ``VulkanPartitioner()``) must lower without
leaving an op outside the delegate, delegate the same fused op stock ExecuTorch
delegates, and simulate (from the lowered payload) to the quantized eager model.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from torch import nn

pytest.importorskip("torchao")

from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup

from fusionkit import FusionPass, op_key

#: torch's 4-bit dtype (missing from torch's type stubs)
INT4: Any = torch.int4  # type: ignore[attr-defined]

K, N = 256, 64


def config(kind: str, group: int) -> Any:
    gran = PerAxis(0) if group == 0 else PerGroup(group)
    if kind == "w4":
        return IntxWeightOnlyConfig(weight_dtype=INT4, granularity=gran)
    if kind == "w8":
        return IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=gran)
    return Int8DynamicActivationIntxWeightConfig(weight_dtype=INT4,
                                                 weight_granularity=gran)


#: the fused op each configuration is delegated as (None: the unfused ops are delegated)
FUSED = {"w4": "et_vk.linear_q4gsw.default", "8da4w": "et_vk.linear_dq8ca_q4gsw.default",
         "w8": None}


def _cases() -> list[tuple[str, int, bool, tuple[int, ...]]]:
    """Each 4-bit kind meets every (bias, rows) pair once across its four group sizes."""
    rows: list[tuple[int, ...]] = [(1, 1), (2, 3)]
    pairs = list(itertools.product([False, True], rows))
    out: list[tuple[str, int, bool, tuple[int, ...]]] = [(kind, g, bias, rows) for kind in ("w4", "8da4w")
           for g, (bias, rows) in zip((32, 64, 128, 256), pairs[::1] if kind == "w4"
                                      else pairs[::-1], strict=True)]
    out += [("w8", 0, False, (1,)), ("w8", 0, True, (3,))]  # per channel
    return out


def _params() -> list[Any]:
    return [pytest.param(*c)
            for c in _cases()]


def quantized_linear(kind: str, group: int, bias: bool) -> nn.Module:
    torch.manual_seed(group + 7 * bias)
    m = nn.Sequential(nn.Linear(K, K, bias=bias), nn.ReLU(), nn.Linear(K, N, bias=bias)).eval()
    quantize_(m, config(kind, group))
    return m


def delegate_ops(prog: Any) -> list[str]:
    """Op names of every Vulkan payload of a lowered program, decoded from its bytes."""
    from fusionkit.backends.vulkan_adapter import decode_payload

    return [name for _, lm in prog.exported_program().graph_module.named_children()
            if hasattr(lm, "processed_bytes")
            for name in decode_payload(lm.processed_bytes).graph.op_names()]


def outside_ops(prog: Any) -> list[str]:
    return [op_key(n.target) or str(n.target) for n in prog.exported_program().graph.nodes
            if n.op == "call_function" and op_key(n.target)]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "group", "bias", "rows"), _params())
def test_torchao_quantized_linear_lowers_like_stock(kind: str, group: int, bias: bool,
                                                    rows: tuple[int, ...]) -> None:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
        VulkanPartitioner as StockVulkanPartitioner,
    )

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, simulate, transform_passes

    m = quantized_linear(kind, group, bias)
    x = torch.randn(*rows, K)
    ep = torch.export.export(m, (x,))
    stock = to_edge_transform_and_lower(ep, partitioner=[StockVulkanPartitioner()])
    ours = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()])
    assert outside_ops(ours) == [] == outside_ops(stock)
    fused = FUSED[kind]
    stock_fused = [o for o in delegate_ops(stock) if o.startswith("et_vk.linear")]
    our_fused = [o for o in delegate_ops(ours) if o.startswith("et_vk.linear")]
    assert our_fused == stock_fused == ([fused] * 2 if fused else [])
    want = m(x)
    if kind == "w8":
        # No 8-bit weight-only fused op in stock: its delegate holds linear(x,
        # dequantize_affine(w)), which the real runtime refuses ("Missing operator:
        # torchao.dequantize_affine.default"; with it, linear's prepacked weight would be
        # computed) and the CPU runtime has no kernel for; the simulator predicts the
        # refusal, as the runtime meets it first (the probed runtime's operators, or the
        # wheel's without one). Ours: the preprocess rule linear_weight_int8_affine makes it
        # _weight_int8pack_mm (the real runtime: tests/test_vulkan_real_runtime_w8.py).
        from fusionkit.backends.vulkan_adapter.inspect.simulator import UnsupportedOperatorError

        with pytest.raises(UnsupportedOperatorError,
                           match=r"Missing operator: torchao\.dequantize_affine\.default"):
            simulate(stock, x)
        ops = delegate_ops(ours)
        assert ops.count("aten._weight_int8pack_mm.default") == 2, ops
        assert "torchao.dequantize_affine.default" not in ops, ops
    torch.testing.assert_close(simulate(ours, x), want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_transform_passes_ask_the_partitioner_they_are_given() -> None:
    """A fused op the partitioner's options refuse is not made before partitioning."""
    import rmsnorm_models as R
    from executorch.exir.dialects._ops import ops as exir_ops

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes

    m, args = R.row_case(R.ROWS[0], torch.float32)
    part = VulkanPartitioner(operator_blocklist=[exir_ops.edge.et_vk.rms_norm.default])
    passes = transform_passes(partitioner=part)
    prog = to_edge_transform_and_lower(torch.export.export(m, args), transform_passes=passes,
                                       partitioner=[part])
    (fusion,) = [p for p in passes if isinstance(p, FusionPass)]
    reasons = [d.reason for d in fusion.report.declined]
    assert any("would not delegate the fused et_vk.rms_norm.default (op is in blocklist)" in r
               for r in reasons)
    assert "et_vk.rms_norm.default" not in outside_ops(prog)


@pytest.mark.slow
def test_the_decline_names_the_partitioners_reason() -> None:
    """linear_q4gsw: ExecuTorch's registry declares every input float; the packed weight is uint8."""
    from executorch.exir import to_edge

    from fusionkit.backends.vulkan_adapter import transform_passes

    m = quantized_linear("w4", 32, True)
    ep = to_edge(torch.export.export(m, (torch.randn(2, K),))).exported_program()
    fusion = transform_passes()[-1]
    fusion(ep)
    text = str(fusion.report)
    assert "delegated_by_vulkan_partitioner" in text
    assert "input[1] dtype torch.uint8 not in" in text
    assert not any(op_key(n.target) == "et_vk.linear_q4gsw.default" for n in ep.graph.nodes)
