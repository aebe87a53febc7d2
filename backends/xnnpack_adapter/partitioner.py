"""The adapter's XnnpackPartitioner: ExecuTorch's, with fusionkit's constant serializer."""

from __future__ import annotations

from typing import Any

from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as _StockXnnpackPartitioner,
)
from executorch.exir.backend.partitioner import PartitionResult
from torch.export import ExportedProgram

from .serializer import install

__all__ = ["XnnpackPartitioner"]


class XnnpackPartitioner(_StockXnnpackPartitioner):
    """ExecuTorch's ``XnnpackPartitioner`` (same arguments) + fusionkit's constant serializer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install()
        super().__init__(*args, **kwargs)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        install()  # preprocess runs right after partitioning, in to_backend
        return super().partition(exported_program)
