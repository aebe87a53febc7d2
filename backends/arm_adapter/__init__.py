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

from typing import Any

from fusionkit import ExecutionTarget, Rule
from fusionkit.integration.adapter import Oracle

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
           "UnsupportedExecuTorchError", "VgfPartitioner", "execution_target", "install",
           "is_installed", "oracle", "rule_sets", "takeover_points", "uninstall"]


# --- what makes this module a fusionkit.BackendAdapter


def rule_sets() -> dict[str, list[Rule]]:
    """The rules run in place of Arm's pattern-shaped fusions."""
    from fusionkit.passes import rule_set

    from .preprocess_rules import RULE_SET

    return {RULE_SET: rule_set(RULE_SET)}


def execution_target() -> ExecutionTarget:
    """Inside Arm's pipeline: only ops a later pass of the TOSA pipeline lowers."""
    from .preprocess_rules import ARM_TARGET

    return ARM_TARGET


def oracle() -> Oracle | None:
    """The TOSA reference model (``tosa-tools``), when installed."""
    import importlib.util

    if importlib.util.find_spec("tosa_reference_model") is None:
        return None

    def run(program: Any, inputs: tuple[Any, ...]) -> list[Any]:
        from .reference_model import run_on_reference_model

        return run_on_reference_model(program, inputs)

    return run


def takeover_points() -> dict[str, str]:
    """Arm's stock passes replaced while installed -> the rules' factory."""
    from .preprocess_rules import TAKEN_OVER_PASSES

    return dict(TAKEN_OVER_PASSES)
