"""The XNNPACK adapter's patch set: everything its preprocess changes, as one.

:data:`PATCHES` is the constant serializer (:mod:`.serializer`), fusionkit rules in place
of XNNPACK's pattern-rewrite passes (:mod:`.preprocess_rules`), the gates of the passes
left (:mod:`.pass_gates`) and the partition conditions (:mod:`.batch_norm_partition`,
:mod:`.mixed_conv_partition`), each a reversible :class:`~fusionkit.integration.hooks.PatchSet`.
The adapter's partitioner installs it around each preprocess of a partition it made;
:func:`install` puts it in place process-wide (for stock partitioners too) until
:func:`uninstall`. As in every adapter (one skeleton,
:class:`~fusionkit.integration.adapter.Adapter`), ``install`` / ``uninstall`` /
``is_installed`` are the patch set's own methods: idempotent, all or nothing,
``with install():`` undoes only what that call installed, and an untested ExecuTorch is refused
(:class:`~fusionkit.integration.hooks.UnsupportedExecuTorchError`).
"""

from __future__ import annotations

from fusionkit.backends import quantize_step
from fusionkit.integration.adapter import Adapter
from fusionkit.integration.hooks import Installation, UnsupportedExecuTorchError

from . import (
    batch_norm_partition,
    boundary_qdq,
    mixed_conv_partition,
    pass_gates,
    preprocess_rules,
    serializer,
)

__all__ = ["ADAPTER", "PATCHES", "Installation", "UnsupportedExecuTorchError", "install",
           "is_installed", "uninstall"]

#: the serializer, the rules in place of the stock rewrite passes, the gates (same bytes);
#: XnnpackBackend.preprocess runs under them for this adapter's partitions only
ADAPTER = Adapter("fusionkit.backends.xnnpack_adapter",
                  parts=(serializer.SERIALIZER_PATCHES, preprocess_rules.PATCHES,
                         pass_gates.PATCHES, boundary_qdq.PATCHES, quantize_step.PATCHES,
                         batch_norm_partition.PATCHES, mixed_conv_partition.PATCHES),
                  backend=("executorch.backends.xnnpack.xnnpack_preprocess", "XnnpackBackend"),
                  marker=b"xnnpack")
PATCHES = ADAPTER.patches

install = ADAPTER.install
uninstall = ADAPTER.uninstall
is_installed = ADAPTER.is_installed
