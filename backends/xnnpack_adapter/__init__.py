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

from executorch.exir.pass_base import ExportedProgramPassBase

from fusionkit.integration.compact_constants import CompactConstantsPass
from fusionkit.integration.hooks import TESTED_EXECUTORCH

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
    "PATCHES",
    "TESTED_EXECUTORCH",
    "CompactConstantsPass",
    "Installation",
    "UnsupportedExecuTorchError",
    "XnnpackPartitioner",
    "install",
    "is_installed",
    "transform_passes",
    "uninstall",
]


def transform_passes(compact_constants: bool = True) -> list[ExportedProgramPassBase]:
    """Passes for ``to_edge_transform_and_lower(transform_passes=...)``.

    With ``compact_constants`` (default) every constant that does not own its
    storage exactly is replaced by a compact copy before partitioning.
    """
    return [CompactConstantsPass()] if compact_constants else []
