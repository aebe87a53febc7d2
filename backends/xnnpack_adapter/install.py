"""The XNNPACK adapter's patch set: everything its preprocess changes, as one.

:data:`PATCHES` is the constant serializer (:mod:`.serializer`), fusionkit rules in place
of XNNPACK's pattern-rewrite passes (:mod:`.preprocess_rules`) and the gates of the passes
left (:mod:`.pass_gates`), each a reversible :class:`~fusionkit.integration.hooks.PatchSet`.
The adapter's partitioner installs it around each preprocess of a partition it made;
:func:`install` puts it in place process-wide (for stock partitioners too) until
:func:`uninstall`. As in every adapter, ``install`` / ``uninstall`` / ``is_installed`` are
the patch set's own methods: idempotent, all or nothing, ``with install():`` undoes only
what that call installed, and an untested ExecuTorch is refused
(:class:`~fusionkit.integration.hooks.UnsupportedExecuTorchError`).
"""

from __future__ import annotations

from fusionkit.integration.hooks import Installation, PatchSet, UnsupportedExecuTorchError

from . import pass_gates, preprocess_rules, serializer

__all__ = ["PATCHES", "Installation", "UnsupportedExecuTorchError", "install", "is_installed",
           "uninstall"]

#: the serializer, the rules in place of the stock rewrite passes, the gates (same bytes)
PATCHES = PatchSet("fusionkit.backends.xnnpack_adapter", lambda: [],
                   includes=(serializer.SERIALIZER_PATCHES, preprocess_rules.PATCHES,
                             pass_gates.PATCHES))

install = PATCHES.install
uninstall = PATCHES.uninstall
is_installed = PATCHES.is_installed
