"""The Arm adapter's patch set: fusionkit rules in place of Arm's pattern-shaped fusions.

:data:`PATCHES` is :mod:`.preprocess_rules`' patch of ``ArmPassManager._transform`` (every
Arm backend runs that pass manager: TOSA, Ethos-U through ``TOSABackend._preprocess``,
VGF). Each of the adapter's partitioners installs it around each preprocess of a partition
it made (one :class:`~fusionkit.integration.adapter.Adapter` per backend: the backend whose
``preprocess`` is scoped differs, the patch set is the same); :func:`install` puts it in
place process-wide (for stock partitioners too) until :func:`uninstall`. As in every
adapter, ``install`` / ``uninstall`` / ``is_installed`` are the patch set's own methods:
idempotent, all or nothing, ``with install():`` undoes only what that call installed, and
an untested ExecuTorch is refused
(:class:`~fusionkit.integration.hooks.UnsupportedExecuTorchError`).
"""

from __future__ import annotations

from fusionkit.backends import quantize_step
from fusionkit.integration.adapter import Adapter
from fusionkit.integration.hooks import Installation, UnsupportedExecuTorchError

from . import preprocess_rules, quantizer

#: installed with the adapter: the quantize step's conv + batch-norm fold as rules, and the
#: Arm quantizer's conv-scale fold binding new tensors (the user's module is never written)
_QUANTIZE = (quantize_step.PATCHES, quantizer.PATCHES)

__all__ = ["ADAPTER", "ETHOSU_ADAPTER", "PATCHES", "VGF_ADAPTER", "Installation",
           "UnsupportedExecuTorchError", "install", "is_installed", "uninstall"]

_COMPONENT = "fusionkit.backends.arm_adapter"

#: the TOSA backend: TOSABackend.preprocess runs under the rules for this adapter's
#: partitions only
ADAPTER = Adapter(_COMPONENT, parts=(preprocess_rules.PATCHES, *_QUANTIZE),
                  backend=("executorch.backends.arm.tosa.backend", "TOSABackend"),
                  marker=b"arm")
#: the same rules for the Ethos-U backend's partitions (its preprocess calls TOSA's)
ETHOSU_ADAPTER = Adapter(f"{_COMPONENT} (Ethos-U)", parts=(preprocess_rules.PATCHES, *_QUANTIZE),
                         backend=("executorch.backends.arm.ethosu.backend", "EthosUBackend"),
                         marker=b"arm-ethos-u")
#: the same rules for the VGF backend's partitions
VGF_ADAPTER = Adapter(f"{_COMPONENT} (VGF)", parts=(preprocess_rules.PATCHES, *_QUANTIZE),
                      backend=("executorch.backends.arm.vgf.backend", "VgfBackend"),
                      marker=b"arm-vgf")
PATCHES = ADAPTER.patches

install = ADAPTER.install
uninstall = ADAPTER.uninstall
is_installed = ADAPTER.is_installed
