"""XNNPACK adapter: ExecuTorch's XNNPACK lowering with correct constant bytes.

Drop-in::

    from fusionkit.backends.xnnpack_adapter import XnnpackPartitioner, transform_passes
    prog = to_edge_transform_and_lower(
        ep, transform_passes=transform_passes(), partitioner=[XnnpackPartitioner()]
    ).to_executorch()

:class:`XnnpackPartitioner` takes exactly what ExecuTorch's takes; the
partitions it makes are preprocessed with fusionkit's XNNPACK constant serializer,
so every constant XNNPACK serializes – including those its own preprocess passes
create – is written from the tensor's own bytes, and XNNPACK's pattern-rewrite passes
(activation fusion, concatenate decomposition, 1-D convolutions, ...) are run as the
fusionkit rules of :mod:`fusionkit.passes.xnnpack` in the stock passes' place
(:mod:`.preprocess_rules`; the payload is byte-identical, except where a stock pass was
wrong: see ``docs/xnnpack-rules.md``). Nothing else in the process
changes: a stock lowering beside it is untouched. :func:`install` (idempotent,
``with install():`` scopes it) puts the adapter's patch set (:data:`PATCHES`: the
serializer, the preprocess rules, the pass gates; :mod:`.install`) in place process-wide,
for stock partitioners too, until :func:`uninstall`. :func:`transform_passes` adds :class:`~fusionkit.integration.compact_constants.CompactConstantsPass`,
which gives every constant its own storage before lowering (smaller programs for
any backend; not needed for correctness with this adapter).
"""

from __future__ import annotations

from typing import Any

from executorch.exir.pass_base import ExportedProgramPassBase

from fusionkit import ExecutionTarget, Rule
from fusionkit.integration.adapter import Oracle
from fusionkit.integration.compact_constants import CompactConstantsPass
from fusionkit.integration.hooks import TESTED_EXECUTORCH
from fusionkit.integration.parameter_subgraphs import FoldParameterSubgraphsPass

from .install import (
    PATCHES,
    Installation,
    UnsupportedExecuTorchError,
    install,
    is_installed,
    uninstall,
)
from .partitioner import XnnpackPartitioner

__all__ = [
    "CONSTANT_ARGS",
    "PATCHES",
    "TESTED_EXECUTORCH",
    "CompactConstantsPass",
    "FoldParameterSubgraphsPass",
    "Installation",
    "UnsupportedExecuTorchError",
    "XnnpackPartitioner",
    "execution_target",
    "install",
    "is_installed",
    "oracle",
    "rule_sets",
    "takeover_points",
    "transform_passes",
    "uninstall",
]


#: op name -> the argument indices XNNPACK's partitioner requires to be static parameters
#: (``GEMMConfig._get_weight_deps``: "Expected weight to be a static param"; the bias
#: likewise), else the op stays on the portable CPU kernels
CONSTANT_ARGS: dict[str, tuple[int, ...]] = {
    "aten.convolution.default": (1, 2),
    "aten.linear.default": (1, 2),
}


def transform_passes(compact_constants: bool = True,
                     fold_parameter_subgraphs: bool = True) -> list[ExportedProgramPassBase]:
    """Passes for ``to_edge_transform_and_lower(transform_passes=...)``.

    With ``fold_parameter_subgraphs`` (default) a convolution's or linear's weight or
    bias that the graph computes from parameters alone (``weight_norm``'s ``g * v / |v|``)
    is computed once and becomes a constant, so XNNPACK takes the op
    (:class:`~fusionkit.integration.parameter_subgraphs.FoldParameterSubgraphsPass`).
    With ``compact_constants`` (default) every constant that does not own its
    storage exactly is replaced by a compact copy before partitioning.
    """
    passes: list[ExportedProgramPassBase] = []
    if fold_parameter_subgraphs:
        passes.append(FoldParameterSubgraphsPass(CONSTANT_ARGS))
    if compact_constants:
        passes.append(CompactConstantsPass())
    return passes


# --- what makes this module a fusionkit.BackendAdapter


def rule_sets() -> dict[str, list[Rule]]:
    """The rules run in place of XNNPACK's pattern-rewrite passes."""
    from fusionkit.passes import rule_set

    return {"xnnpack": rule_set("xnnpack")}


def execution_target() -> ExecutionTarget:
    """Inside preprocess: what a rule creates must be an op XNNPACK's serializer writes."""
    from .preprocess_rules import XNNPACK_TARGET

    return XNNPACK_TARGET


def oracle() -> Oracle:
    """The program's ``.pte`` run by ExecuTorch's runtime (XNNPACK's delegate in it)."""
    def run(program: Any, inputs: tuple[Any, ...]) -> list[Any]:
        from executorch.extension.pybindings.portable_lib import (
            _load_for_executorch_from_buffer,
        )

        pte = program.to_executorch().buffer  # held while the runtime runs it
        return list(_load_for_executorch_from_buffer(pte).forward(list(inputs)))

    return run


def takeover_points() -> dict[str, str]:
    """XNNPACK's stock preprocess passes replaced while installed -> the rules' factory."""
    from .preprocess_rules import TAKEN_OVER_PASSES

    return dict(TAKEN_OVER_PASSES)
