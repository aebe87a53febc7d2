"""Quantized programs on ExecuTorch's real Vulkan runtime: 4-bit weight-only and 8da4w
linears, the 4-bit embedding and the pt2e int8 convolutions, lowered by fusionkit, run
for real and compared with the *quantized* eager model (tolerances as in
tests/test_vulkan_quantized_e2e.py, where the same programs are simulated)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("torchao")

from test_vulkan_quantized_e2e import INT4, VOCAB, ConvNet, decoder
from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig
from torchao.quantization.granularity import PerGroup
from vulkan_real_programs import Program, lower, run_all


def _tokens(s: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, s), generator=torch.Generator().manual_seed(s))


def _conv_net() -> tuple[Any, torch.Tensor]:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(4)
    x = torch.randn(1, 4, 8, 8)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(ConvNet().eval(), (x,)).module(), quantizer)
    for _ in range(4):
        prepared(torch.randn(1, 4, 8, 8))
    return convert_pt2e(prepared), x


@pytest.fixture(scope="module")
def programs(vulkan_runtime: Any) -> list[Program]:
    cases: list[tuple[str, Any, tuple[Any, ...], float]] = [
        ("llama int4 weight-only g32", decoder(IntxWeightOnlyConfig(
            weight_dtype=INT4, granularity=PerGroup(32))), (_tokens(5),), 1e-4),
        ("llama 8da4w g32", decoder(Int8DynamicActivationIntxWeightConfig(
            weight_dtype=INT4, weight_granularity=PerGroup(32))), (_tokens(3),), 1e-3),
        ("llama int4 + 4-bit embedding", decoder(IntxWeightOnlyConfig(
            weight_dtype=INT4, granularity=PerGroup(64)), embedding=True, seed=1),
         (_tokens(4),), 1e-4),
    ]
    q, x = _conv_net()
    with torch.no_grad():
        step = float((q(x).abs().max() / 127).item())
    cases.append(("pt2e int8 conv net", q, (x,), 1.01 * step))
    out = []
    for name, model, args, tol in cases:
        with torch.no_grad():
            eager = model(*args)
        out.append(lower(name, "quantized", "fusionkit", torch.export.export(model, args), args,
                         eager, tolerance=(tol, tol if tol < 1e-2 else 0.0)))
    run_all(out)
    return out


def test_quantized_programs_equal_quantized_eager_on_the_real_runtime(
        programs: list[Program]) -> None:
    bad = [p.describe() for p in programs if p.lower_error or p.outcome != "ok"]
    assert not bad, bad


def test_simulator_and_check_agree_on_the_quantized_programs(programs: list[Program]) -> None:
    wrong = [p.describe() for p in programs if not (p.simulator_agrees and p.check_agrees)]
    assert not wrong, wrong
