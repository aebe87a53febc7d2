"""Explicit, reversible takeover of the stock Vulkan patterns fusionkit reimplements.

ExecuTorch 1.5.1's Vulkan backend keeps its fusions in one global dict,
``executorch.backends.vulkan.patterns.pattern_registry.fusable_patterns``. Both
``VulkanPartitioner.partition`` (via ``get_all_fusable_subgraphs``: every node a
detector claims is treated as supported, unchecked) and
``VulkanBackend.preprocess`` (via ``FusePatternsPass`` ->
``replace_all_fusable_subgraphs``: the rewrite) iterate that dict at call time.
Its ``rms_norm`` detector fuses *any* multiply after a decomposed RMSNorm,
including ones whose weight is not a constant, which the runtime then aborts on.

:func:`install` removes the entries listed in :data:`TAKEN_OVER_PATTERNS` from
that dict (fusionkit's ``transform_passes()`` does their job, with
constraints), so neither the partitioner nor preprocess fuses anything on its
own. It also installs the colleague-owned :mod:`.constant_serializer` (constants
that are views serialized as themselves, not as their whole base storage).
:func:`uninstall` puts the very same entry objects back (and uninstalls the
serializer if this install put it in). Both are
idempotent; ``install()`` also works as a context manager that restores the
previous state on exit. ``install()`` refuses to patch an ExecuTorch version
the adapter was not tested with.
"""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import Any

from . import constant_serializer

# one exception type for the whole adapter (the constant serializer raises it too)
UnsupportedExecuTorchError = constant_serializer.UnsupportedExecuTorchError

__all__ = [
    "TAKEN_OVER_PATTERNS",
    "TESTED_EXECUTORCH_VERSIONS",
    "Installation",
    "UnsupportedExecuTorchError",
    "executorch_version",
    "install",
    "is_installed",
    "uninstall",
]

#: ExecuTorch versions whose Vulkan pattern registry this module was verified against
TESTED_EXECUTORCH_VERSIONS: frozenset[str] = frozenset({"1.5.1"})

#: stock Vulkan pattern name -> the fusionkit rule that replaces it
TAKEN_OVER_PATTERNS: dict[str, str] = {
    "rms_norm": "fusionkit.passes.rms_norm.rms_norm_rule",
}

_REGISTRY_MODULE = "executorch.backends.vulkan.patterns.pattern_registry"

_lock = threading.RLock()
#: the entries removed from the registry while installed (None: not installed)
_saved: dict[str, Any] | None = None
#: whether our install() also installed the constant serializer (so uninstall() undoes it)
_serializer_installed_here = False


def executorch_version() -> str | None:
    try:
        return version("executorch")
    except PackageNotFoundError:
        return None


def _check_version() -> None:
    v = executorch_version()
    if v not in TESTED_EXECUTORCH_VERSIONS:
        raise UnsupportedExecuTorchError(
            f"fusionkit's Vulkan adapter was tested with ExecuTorch "
            f"{', '.join(sorted(TESTED_EXECUTORCH_VERSIONS))}, but "
            f"{'no ExecuTorch' if v is None else f'ExecuTorch {v}'} is installed. It "
            f"replaces the stock Vulkan patterns {sorted(TAKEN_OVER_PATTERNS)} by editing "
            f"{_REGISTRY_MODULE}.fusable_patterns, whose layout may differ in other "
            "versions; refusing to patch it. Use ExecuTorch's own VulkanPartitioner, or "
            "verify the adapter against this version and add it to "
            "TESTED_EXECUTORCH_VERSIONS."
        )


def _registry() -> dict[str, Any]:
    # importing the package registers every stock pattern into the dict
    importlib.import_module("executorch.backends.vulkan.patterns")
    module = importlib.import_module(_REGISTRY_MODULE)
    registry: dict[str, Any] = module.fusable_patterns
    return registry


class Installation:
    """What :func:`install` returns; as a context manager it restores the previous state."""

    def __init__(self, installed_here: bool) -> None:
        #: True when this call did the installing (False: it was already installed)
        self.installed_here = installed_here

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.installed_here:
            uninstall()

    def __repr__(self) -> str:
        return f"Installation(installed_here={self.installed_here})"


def is_installed() -> bool:
    return _saved is not None


def install() -> Installation:
    """Take over the stock Vulkan patterns fusionkit reimplements (idempotent).

    Raises :class:`UnsupportedExecuTorchError` on an untested ExecuTorch version.
    """
    global _saved, _serializer_installed_here
    with _lock:
        if _saved is not None:
            return Installation(False)
        _check_version()
        registry = _registry()
        missing = [name for name in TAKEN_OVER_PATTERNS if name not in registry]
        if missing:
            raise UnsupportedExecuTorchError(
                f"the stock Vulkan pattern registry has no {missing} entry; this ExecuTorch "
                "build does not look like the one the adapter was tested with"
            )
        saved = {name: registry.pop(name) for name in TAKEN_OVER_PATTERNS}
        try:
            # the correct Vulkan constant serializer (views serialized as themselves,
            # not as their whole base storage); a no-op if it is already installed
            serializer_here = constant_serializer.install().installed_here
        except BaseException:
            registry.update(saved)
            raise
        _saved = saved
        _serializer_installed_here = serializer_here
        return Installation(True)


def uninstall() -> None:
    """Restore the stock Vulkan patterns (idempotent)."""
    global _saved, _serializer_installed_here
    with _lock:
        if _saved is None:
            return
        if _serializer_installed_here:
            constant_serializer.uninstall()
            _serializer_installed_here = False
        registry = _registry()
        for name, entry in _saved.items():
            registry.setdefault(name, entry)
        _saved = None
