"""Arm adapter: ExecuTorch's Arm (TOSA) lowering with its fusions as fusionkit rules.

Drop-in::

    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from fusionkit.backends.arm_adapter import TOSAPartitioner
    edge = to_edge_transform_and_lower(
        ep, partitioner=[TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))])

:class:`TOSAPartitioner` (and :class:`EthosUPartitioner`, :class:`VgfPartitioner`, which
share Arm's pass manager) take exactly what ExecuTorch's take; the partitions they make
are preprocessed with Arm's pattern-shaped fusions run as the fusionkit rules of
:mod:`fusionkit.passes.arm` in the stock passes' place (:mod:`.preprocess_rules`). Nothing
else in the process changes: a stock lowering beside it is untouched. :func:`install`
(idempotent, ``with install():`` scopes it) puts the rules in place process-wide, for
stock partitioners too, until :func:`uninstall`. :mod:`.reference_model` is the oracle:
a lowered program run on the TOSA reference model (``tosa-tools``) beside eager PyTorch.
"""

from __future__ import annotations

from .install import (
    ADAPTER,
    PATCHES,
    Installation,
    UnsupportedExecuTorchError,
    install,
    is_installed,
    uninstall,
)
from .partitioner import EthosUPartitioner, TOSAPartitioner, VgfPartitioner

__all__ = ["ADAPTER", "PATCHES", "EthosUPartitioner", "Installation", "TOSAPartitioner",
           "UnsupportedExecuTorchError", "VgfPartitioner", "install", "is_installed",
           "uninstall"]
