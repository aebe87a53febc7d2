"""The adapter's partitioners: ExecuTorch's Arm partitioners, the rules scoped to them.

``TOSAPartitioner``, ``EthosUPartitioner`` and ``VgfPartitioner`` take exactly what
ExecuTorch's take (a ``TosaCompileSpec`` / ``EthosUCompileSpec`` / ``VgfCompileSpec`` and
the optional ``additional_checks``) and partition the same way; their partitions carry a
marker compile spec, and the backend's ``preprocess`` runs with the Arm rules in place of
the stock fusions for those partitions only
(:class:`~fusionkit.integration.scoped.PreprocessScope`). A stock partitioner in the same
process is unaffected; a process-wide install happens only through an explicit
:func:`~.install.install`.
"""

from __future__ import annotations

from executorch.backends.arm.ethosu.partitioner import (
    EthosUPartitioner as _StockEthosUPartitioner,
)
from executorch.backends.arm.tosa.partitioner import TOSAPartitioner as _StockTOSAPartitioner
from executorch.backends.arm.vgf.partitioner import VgfPartitioner as _StockVgfPartitioner

from fusionkit.integration.adapter import ScopedPartitioner

from .install import ADAPTER, ETHOSU_ADAPTER, VGF_ADAPTER

#: TOSABackend.preprocess runs with the rules for this adapter's partitions only
PREPROCESS_SCOPE = ADAPTER.preprocess_scope

__all__ = ["PREPROCESS_SCOPE", "EthosUPartitioner", "TOSAPartitioner", "VgfPartitioner"]


class TOSAPartitioner(ScopedPartitioner, _StockTOSAPartitioner):
    """ExecuTorch's ``TOSAPartitioner`` (same arguments) + Arm's fusions as fusionkit rules."""

    fusionkit_adapter = ADAPTER


class EthosUPartitioner(ScopedPartitioner, _StockEthosUPartitioner):
    """ExecuTorch's ``EthosUPartitioner`` (same arguments) + Arm's fusions as fusionkit rules."""

    fusionkit_adapter = ETHOSU_ADAPTER


class VgfPartitioner(ScopedPartitioner, _StockVgfPartitioner):
    """ExecuTorch's ``VgfPartitioner`` (same arguments) + Arm's fusions as fusionkit rules."""

    fusionkit_adapter = VGF_ADAPTER
