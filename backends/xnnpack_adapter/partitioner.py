"""The adapter's XnnpackPartitioner: ExecuTorch's, with fusionkit's constant serializer.

While it partitions, the partition conditions (:mod:`.batch_norm_partition`,
:mod:`.mixed_conv_partition`) hold.

The serializer fix applies only to this partitioner's partitions: they carry a
marker compile spec, and ``XnnpackBackend.preprocess`` runs with the serializer
hooks installed for those partitions only
(:class:`~fusionkit.integration.scoped.PreprocessScope`). A stock
``XnnpackPartitioner`` in the same process is unaffected; a process-wide
install happens only through an explicit :func:`~.install.install`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as _StockXnnpackPartitioner,
)

from fusionkit.integration.adapter import ScopedPartitioner

from . import batch_norm_partition, mixed_conv_partition
from .install import ADAPTER

#: XnnpackBackend.preprocess runs with the serializer fix for this adapter's partitions only
PREPROCESS_SCOPE = ADAPTER.preprocess_scope

__all__ = ["PREPROCESS_SCOPE", "XnnpackPartitioner"]


class XnnpackPartitioner(ScopedPartitioner, _StockXnnpackPartitioner):
    """ExecuTorch's ``XnnpackPartitioner`` (same arguments) + fusionkit's constant serializer
    and partition conditions (:mod:`.batch_norm_partition`, :mod:`.mixed_conv_partition`: what
    XNNPACK cannot compute stays on the CPU)."""

    fusionkit_adapter = ADAPTER

    @contextmanager  # type: ignore[override]
    def _partitioning(self, exported_program: Any) -> Iterator[None]:
        with batch_norm_partition.PATCHES.install(), mixed_conv_partition.PATCHES.install():
            yield
