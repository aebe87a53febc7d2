"""The XNNPACK serializer's constant lookups do not keep programs alive.

Its per-program cache is keyed weakly by the program; a cached value that held the program
kept every preprocessed program, and each constant it delegated, alive until the process
ended (Qwen3-0.6B through ``export_llm``: peak RSS 1.20x stock). After a lowering is
dropped, the cache must be empty.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

import fusionkit.backends.xnnpack_adapter as xa
from fusionkit.backends.xnnpack_adapter import serializer


def test_a_dropped_lowering_leaves_no_program_in_the_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    original = serializer._program_inputs

    def counted(ep: Any) -> Any:
        read.append(1)
        return original(ep)

    monkeypatch.setattr(serializer, "_program_inputs", counted)
    was = xa.is_installed()
    xa.install()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 8)).eval()
        ep = torch.export.export(model, (torch.randn(2, 16),))
        program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        # the serializer read constants through the cache (the program it cached may be
        # collected already: a preprocess works on a copy that dies with it)
        assert read
        et = program.to_executorch()
        assert et.buffer
        del program, et, ep
        gc.collect()
        assert len(serializer._inputs_cache) == 0
    finally:
        if not was:
            xa.uninstall()
