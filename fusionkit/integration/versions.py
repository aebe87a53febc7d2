"""The ExecuTorch releases fusionkit supports, and what differs between them: one place.

fusionkit hooks into ExecuTorch internals (serializer methods, pattern registries, pass
lists), so it supports a range of releases whose internals it was run against, not any
ExecuTorch. :data:`SUPPORTED_EXECUTORCH` is that range (the same as ``pyproject.toml``'s
``executorch`` requirement), :data:`TESTED_EXECUTORCH` the releases in it that were
installed and tested, :data:`MAIN_EXECUTORCH` the one ``scripts/bootstrap`` installs and
the whole suite runs on. :func:`require_supported` refuses anything else with one error
naming the range; the command line and every adapter call it before doing any work.

Where the supported releases differ in something fusionkit mirrors, :class:`Features`
names the difference and the release that brought it, and the code that depends on it
asks :func:`features` instead of comparing version strings itself.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = [
    "MAIN_EXECUTORCH",
    "SUPPORTED_EXECUTORCH",
    "TESTED_EXECUTORCH",
    "Features",
    "UnsupportedExecuTorchError",
    "distribution_version",
    "features",
    "installed_executorch_version",
    "is_supported",
    "release",
    "require_supported",
]

#: the ExecuTorch range fusionkit supports (pyproject.toml's ``executorch`` requirement)
SUPPORTED_EXECUTORCH = ">=1.4,<1.6"
#: the releases in that range fusionkit was installed and tested with (docs/versions.md)
TESTED_EXECUTORCH: frozenset[str] = frozenset({"1.4.0", "1.4.1", "1.5.0", "1.5.1"})
#: the release ``scripts/bootstrap`` installs, the whole test suite's (and CI's) pin
MAIN_EXECUTORCH = "1.5.1"


class UnsupportedExecuTorchError(RuntimeError):
    """The installed ExecuTorch is outside the range fusionkit supports."""


@functools.cache
def distribution_version(name: str) -> str:
    """``importlib.metadata.version(name)``, once per process, read from the distribution's
    ``<name>-<version>.dist-info`` directory name where it has one: parsing its METADATA
    (and importing the ``email`` package to do it) cost every lowering ~5 ms. Raises
    ``importlib.metadata.PackageNotFoundError`` as that does."""
    dist = importlib.metadata.distribution(name)
    stem = getattr(getattr(dist, "_path", None), "name", "")
    if stem.endswith(".dist-info") and "-" in stem:
        found = stem[: -len(".dist-info")].split("-", 1)[1]
        if found:
            return found
    return dist.version


def installed_executorch_version() -> str:
    """The installed ``executorch`` distribution's version, or ``"not installed"``."""
    try:
        return distribution_version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def release(version: str) -> tuple[int, ...] | None:
    """The release numbers of a version string (``"1.5.1+cpu"`` -> ``(1, 5, 1)``); None when
    it is no version."""
    try:
        return Version(version).release
    except InvalidVersion:
        return None


def is_supported(version: str) -> bool:
    """Whether ``version`` is in :data:`SUPPORTED_EXECUTORCH` (a pre-release or development
    build of the first excluded release is not: ``1.6.0.dev1`` is outside ``<1.6``)."""
    try:
        return SpecifierSet(SUPPORTED_EXECUTORCH).contains(version, prereleases=True)
    except InvalidVersion:
        return False


def require_supported(component: str = "fusionkit", found: str | None = None) -> str:
    """Raise :class:`UnsupportedExecuTorchError` unless the installed ExecuTorch is in range.

    Returns the version found. ``component`` names what refused (an adapter's patch set,
    a command). The message names the range, the tested releases and what to install.
    """
    found = installed_executorch_version() if found is None else found
    if is_supported(found):
        return found
    tested = ", ".join(sorted(TESTED_EXECUTORCH, key=Version))
    raise UnsupportedExecuTorchError(
        f"{component}: ExecuTorch {found} is not supported: fusionkit hooks into ExecuTorch "
        f"internals and supports executorch{SUPPORTED_EXECUTORCH} (tested against ExecuTorch "
        f"{tested}). Install one of those (pip install 'executorch{SUPPORTED_EXECUTORCH}'; "
        "docs/versions.md), or lower with ExecuTorch's own partitioner (without fusionkit's "
        "fixes)."
    )


@dataclass(frozen=True)
class Features:
    """What differs between the supported ExecuTorch releases, for the code that mirrors it.

    Each flag names the release that brought the difference; code asks the flag, never
    the version string.
    """

    #: the ExecuTorch version these features are of
    version: str
    #: XNNPACK takes bf16 (1.5.0): its partitioner has ``enable_bf16`` and its serializer
    #: (``NodeVisitor.define_tensor`` / ``get_serialized_buffer_index``) keeps bf16 tensors
    #: and constants bf16; before, a bf16 constant is written as fp32 like any non-fp16 one
    bf16_delegation: bool

    @classmethod
    def of(cls, version: str) -> Features:
        rel = release(version) or (0,)
        return cls(version=version, bf16_delegation=rel >= (1, 5, 0))


@functools.lru_cache(maxsize=8)
def _features(version: str) -> Features:
    return Features.of(version)


@functools.lru_cache(maxsize=1)
def _installed() -> str:
    return installed_executorch_version()


def features(version: str | None = None) -> Features:
    """The :class:`Features` of ``version`` (default: the installed ExecuTorch)."""
    return _features(_installed() if version is None else version)
