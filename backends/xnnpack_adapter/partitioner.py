"""The adapter's XnnpackPartitioner: ExecuTorch's, with fusionkit's constant serializer.

The serializer fix applies only to this partitioner's partitions: they carry a
marker compile spec, and ``XnnpackBackend.preprocess`` runs with the serializer
hooks installed for those partitions only
(:class:`~fusionkit.integration.scoped.PreprocessScope`). A stock
``XnnpackPartitioner`` in the same process is unaffected; a process-wide
install happens only through an explicit :func:`~.install.install`.
"""

from __future__ import annotations

import functools
from typing import Any

from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as _StockXnnpackPartitioner,
)
from executorch.exir.backend.partitioner import PartitionResult
from torch.export import ExportedProgram

from fusionkit.integration.scoped import PreprocessScope

from .install import PATCHES

#: XnnpackBackend.preprocess runs with the serializer fix for this adapter's partitions only
PREPROCESS_SCOPE = PreprocessScope("executorch.backends.xnnpack.xnnpack_preprocess",
                                   "XnnpackBackend", b"xnnpack", PATCHES)

__all__ = ["PREPROCESS_SCOPE", "XnnpackPartitioner"]


class XnnpackPartitioner(_StockXnnpackPartitioner):
    """ExecuTorch's ``XnnpackPartitioner`` (same arguments) + fusionkit's constant serializer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        PREPROCESS_SCOPE.mark(self.delegation_spec)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        result = super().partition(exported_program)
        PREPROCESS_SCOPE.expect(len(result.partition_tags))
        return result


# the same signature and docs as ExecuTorch's constructor (inspect.signature follows __wrapped__)
functools.update_wrapper(XnnpackPartitioner.__init__, _StockXnnpackPartitioner.__init__)
