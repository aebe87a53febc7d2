"""The Vulkan partitioner's fusable subgraphs are fusionkit's accepted matches, judged on the
real constants of the fake program ``to_edge_transform_and_lower`` partitions.

``export_llm``'s ``quantization.qmode=4w`` / ``8da4w`` on Vulkan gives int4 weights whose
zero points are parameters; ExecuTorch partitions a fake copy of the program
(``get_fake_program``), where ``weight_zero_points_zero`` read a FakeTensor and raised
``GuardOnDataDependentSymNode``: every quantized linear was an ``error`` decline at
partition time (fused in preprocess all the same).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner")


def test_a_4w_linear_of_the_fake_program_is_one_fusable_subgraph() -> None:
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.exir.program._fake_program import get_fake_program
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig, quantize_

    from fusionkit.backends.vulkan_adapter.fusable_subgraphs import (
        fusable_subgraphs,
        partition_with_program,
    )

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False)).eval()
    # export_llm's qmode=4w (examples/models/llama/source_transformation/quantize.py)
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    ep = torch.export.export(model, (torch.randn(1, 3, 64),))
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    fake = get_fake_program(edge.exported_program())

    found: list = []

    def stock_partition(self: object, program: torch.export.ExportedProgram) -> None:
        found.extend(fusable_subgraphs(lambda gm: [], program.graph_module))

    partition_with_program(stock_partition)(None, fake)
    assert len(found) == 1, found
    ops = {str(n.target) for n in found[0].all_nodes}
    # the quantized linear's whole chain: its dequantized weight goes into the delegate
    assert any("dequantize_affine" in o for o in ops) and any("aten.mm" in o for o in ops), ops
