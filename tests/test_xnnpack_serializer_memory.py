"""The XNNPACK serializer's constant lookups do not keep programs alive.

Its per-program cache is keyed weakly by the program; a cached value that held the program
kept every preprocessed program, and each constant it delegated, alive until the process
ended (Qwen3-0.6B through ``export_llm``: peak RSS 1.20x stock). After a lowering is
dropped, the cache must be empty.
"""

from __future__ import annotations

import gc

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

import fusionkit.backends.xnnpack_adapter as xa
from fusionkit.backends.xnnpack_adapter import serializer


def test_a_dropped_lowering_leaves_no_program_in_the_cache() -> None:
    was = xa.is_installed()
    xa.install()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 8)).eval()
        ep = torch.export.export(model, (torch.randn(2, 16),))
        program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        assert len(serializer._inputs_cache) >= 1  # the serializer read constants
        et = program.to_executorch()
        assert et.buffer
        del program, et, ep
        gc.collect()
        assert len(serializer._inputs_cache) == 0
    finally:
        if not was:
            xa.uninstall()
