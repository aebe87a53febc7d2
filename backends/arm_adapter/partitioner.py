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

from typing import Any

from executorch.backends.arm.ethosu.partitioner import (
    EthosUPartitioner as _StockEthosUPartitioner,
)
from executorch.backends.arm.tosa.partitioner import TOSAPartitioner as _StockTOSAPartitioner
from executorch.backends.arm.vgf.partitioner import VgfPartitioner as _StockVgfPartitioner

from fusionkit.integration.adapter import ScopedPartitioner

from .constant_operands import ConstantOperands
from .install import ADAPTER, ETHOSU_ADAPTER, VGF_ADAPTER

#: TOSABackend.preprocess runs with the rules for this adapter's partitions only
PREPROCESS_SCOPE = ADAPTER.preprocess_scope

__all__ = ["PREPROCESS_SCOPE", "EthosUPartitioner", "TOSAPartitioner", "VgfPartitioner"]


class _ConstantOperandsChecked:
    """Adds :class:`~.constant_operands.ConstantOperands` to the stock partitioner's checks
    (a convolution whose weight or bias is not a constant stays on the CPU, reported)."""

    def _create_operator_support(self, containing_program: Any, reporter: Any) -> Any:
        from torch.fx.passes.operator_support import chain

        stock = super()._create_operator_support(containing_program, reporter)  # type: ignore[misc]
        return chain(ConstantOperands(containing_program, reporter), stock)


class TOSAPartitioner(ScopedPartitioner, _ConstantOperandsChecked, _StockTOSAPartitioner):
    """ExecuTorch's ``TOSAPartitioner`` (same arguments) + Arm's fusions as fusionkit rules;
    a convolution whose weight or bias is not a constant stays on the CPU."""

    fusionkit_adapter = ADAPTER


class EthosUPartitioner(ScopedPartitioner, _ConstantOperandsChecked, _StockEthosUPartitioner):
    """ExecuTorch's ``EthosUPartitioner`` (same arguments) + Arm's fusions as fusionkit rules."""

    fusionkit_adapter = ETHOSU_ADAPTER


class VgfPartitioner(ScopedPartitioner, _ConstantOperandsChecked, _StockVgfPartitioner):
    """ExecuTorch's ``VgfPartitioner`` (same arguments) + Arm's fusions as fusionkit rules."""

    fusionkit_adapter = VGF_ADAPTER
